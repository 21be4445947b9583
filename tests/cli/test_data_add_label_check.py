"""`alignflow data add` and the label check (#47): correct near misses versioned, their flip
refused with the pairs and the judge's scores, unjudged pairs stopped until accepted with a
reason that the data version keeps."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.data.snapshot import read_manifest
from alignflow.data.versioning import current_version
from tests.evaluation.label_check_cases import near_misses, stand_in_champion

runner = CliRunner()


@pytest.fixture
def champion(monkeypatch):
    stand_in_champion(monkeypatch)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _add(repo, path, *extra):
    sets = ["--set", f"tracking.uri=sqlite:///{repo.parent / 'unused.db'}"]
    return runner.invoke(app, ["data", "add", str(path), "--repo", str(repo), "--no-push", *sets, *extra])


def test_correct_near_miss_pairs_are_versioned_and_their_flip_is_refused(champion, tmp_path):
    repo = tmp_path / "repo"
    correct = _write(tmp_path / "near-misses.jsonl", near_misses())
    flipped = _write(
        tmp_path / "flipped.jsonl",
        [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in near_misses()],
    )
    refused = _add(repo, flipped)
    assert refused.exit_code == 1, refused.output
    out = refused.output
    assert "not versioned: label_disagreement: the verifiable answers" in out and "[red]" not in out
    assert current_version(repo, "data") is None, "nothing versioned"
    # a few of the disagreeing pairs: file and row, both sides with the judge's scores, the answer
    shown = [line for line in out.splitlines() if line.startswith(f"  {flipped}:")]
    assert len(shown) == 3, out
    assert (
        "[chosen, rejected]: prompt 'What is 0 plus 2?': chosen 'The answer is 3.' (says 3, reward 3.030)"
        in out
    )
    assert "over rejected 'The answer is 2.' (says 2, reward 3.020); the answer is 2 (arithmetic)" in out
    report = json.loads((repo / ".alignflow" / "reports" / "label-check.json").read_text())
    assert report["judge_audit"]["counts"] is False, "the judge fails its audit against the answers"
    added = _add(repo, correct)
    assert added.exit_code == 0, added.output
    assert current_version(repo, "data") is not None and "data version:" in added.output


def test_unjudged_pairs_stop_until_accepted_with_a_reason_the_version_keeps(champion, tmp_path):
    repo = tmp_path / "repo"
    chat = _write(
        tmp_path / "chat.jsonl",
        [
            {"prompt": f"Name colour number {i}.", "chosen": f"Colour {i} is blue.", "rejected": "A banana."}
            for i in range(20)
        ],
    )
    stopped = _add(repo, chat)
    assert stopped.exit_code == 1, stopped.output
    out = stopped.output
    assert "not versioned: cannot_judge: 20 of 20 new pairs cannot be judged" in out
    assert "metadata.answer" in out and '--accept-unjudged "' in out
    assert f"  {chat}:1 [chosen, rejected]: prompt 'Name colour number 0.'" in out, out
    assert current_version(repo, "data") is None
    assert _add(repo, chat, "--accept-unjudged", "  ").exit_code == 2, "a reason is needed"
    reason = "hand-checked by the annotation team, batch 7"
    accepted = _add(repo, chat, "--accept-unjudged", reason)
    assert accepted.exit_code == 0, accepted.output
    assert f"accepted unjudged: {reason}" in accepted.output
    manifest = read_manifest(repo / "data")
    assert manifest["accepted_unjudged"]["reason"] == reason
    assert manifest["accepted_unjudged"]["unjudged"].startswith("20 of 20 new pairs cannot be judged")
    version = current_version(repo, "data")
    shown = runner.invoke(app, ["data", "show", "--repo", str(repo)])
    assert f"accepted unjudged: {reason}" in shown.output
    # the version records the reason: adding (or running on) the same input again passes on it
    again = _add(repo, chat)
    assert again.exit_code == 0, again.output
    assert current_version(repo, "data") == version


def test_loading_the_champion_shows_no_library_progress_bar(champion, monkeypatch, tmp_path):
    """The champion reward model is downloaded from MLflow and loaded by transformers, each
    with its progress bar; neither reaches the console (the user's shell asks for both)."""
    import mlflow.utils.file_utils as mlflow_files
    import transformers.utils.logging as hf_logging

    import alignflow.models.reward_scorer as reward_scorer
    from tests.evaluation.label_check_cases import tier_scorer

    loaded = []

    def load_with_bars(*args, **kwargs):  # what downloading and loading a model draw
        with mlflow_files.ArtifactProgressBar.files("Downloading artifacts", total=2) as bar:
            bar.update()
        list(hf_logging.tqdm(range(3), desc="Loading weights"))
        loaded.append(True)
        return tier_scorer

    monkeypatch.setattr(reward_scorer, "load_reward_scorer", load_with_bars)
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        added = _add(tmp_path / "repo", _write(tmp_path / "near-misses.jsonl", near_misses()))
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
    assert added.exit_code == 0 and loaded, added.output
    assert "Loading weights" not in added.output and "Downloading artifacts" not in added.output, added.output
