"""The pinned set is never trained on: a data version whose train split repeats pinned prompts
(another ``data.split_seed``, say) stops before anything is written, naming each row; and the
checks on new data also run when ``add_dataset`` reuses a version ``data add`` made."""

from __future__ import annotations

import json
import random

import pytest

from alignflow.data.config import DataConfig
from alignflow.data.demo import make_prompt, write_demo_dataset
from alignflow.data.pipeline import add_dataset
from alignflow.data.split import assign_split
from alignflow.data.versioning import current_version
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.contamination import (
    PINNED_PROMPT_IN_TRAINING,
    PinnedSetContamination,
    contamination_guard,
    find_clashes,
    normalised_prompt,
)
from alignflow.evaluation.golden import existing_pinned_records, pin_golden_set
from alignflow.evaluation.label_check import LabelDisagreement, label_guard

EVAL_FRACTION = 0.2


def test_prompts_match_normalised_but_other_phrasings_do_not():
    pinned = [{"prompt": make_prompt(7, 8)}]  # What is 7 plus 8?
    rows = [
        ("a.jsonl", 1, {"id": "x", "prompt": "  what is 7   PLUS 8 "}),
        ("a.jsonl", 2, {"id": "y", "prompt": make_prompt(7, 8, 1)}),  # Add 7 and 8.
        ("a.jsonl", 3, {"id": "z", "prompt": [{"role": "user", "content": "What is 7 plus 8?"}]}),
    ]
    clashes = find_clashes(rows, pinned)
    assert [(c.file, c.row, c.id) for c in clashes] == [("a.jsonl", 1, "x")]
    assert normalised_prompt("What is 7 plus 8?") == normalised_prompt("what is 7 plus 8")
    assert clashes[0].describe().startswith("a.jsonl:1 [prompt]: ")


@pytest.fixture
def pinned_repo(tmp_path):
    """A repo with a first data version (split seed 0) and the pinned set frozen from it."""
    source = write_demo_dataset(
        tmp_path / "in", n_pairs=300, n_scored=50, eval_fraction=EVAL_FRACTION, phrasings=6
    )
    repo = tmp_path / "repo"
    first = add_dataset(source["demo"], DataConfig(eval_fraction=EVAL_FRACTION), repo_dir=repo, push=False)
    pin_golden_set(EvaluationConfig(), first.data_dir, repo)
    return source["demo"], repo, first


def _guard(repo, report):
    pinned = existing_pinned_records(EvaluationConfig(), repo)
    assert pinned, "the frozen pinned set is found before the next data version"
    return contamination_guard(pinned, report), pinned


def test_another_split_seed_puts_pinned_prompts_in_training_and_stops_naming_them(pinned_repo, tmp_path):
    source, repo, first = pinned_repo
    guard, pinned = _guard(repo, tmp_path / "pinned-set-check.json")
    reseeded = DataConfig(eval_fraction=EVAL_FRACTION, split_seed=1)
    with pytest.raises(PinnedSetContamination, match=rf"^{PINNED_PROMPT_IN_TRAINING}: ") as raised:
        add_dataset(source, reseeded, repo_dir=repo, push=False, check_training=guard)
    # every row of the input that seed 1 sends to train and whose prompt is pinned, no other
    pinned_keys = {normalised_prompt(r["prompt"]) for r in pinned}
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    expected = {
        i + 1
        for i, r in enumerate(rows)
        if normalised_prompt(r["prompt"]) in pinned_keys
        and assign_split(r["prompt"], EVAL_FRACTION, 1) == "train"
    }
    assert expected and {c.row for c in raised.value.clashes} == expected
    assert all(c.file.endswith("demo.jsonl") for c in raised.value.clashes)
    assert "of the" in str(raised.value) and "pinned prompts" in str(raised.value)
    report = json.loads((tmp_path / "pinned-set-check.json").read_text())
    assert report["clashing_rows"] == len(expected) and not report["passed"]
    assert {r["row"] for r in report["rows"]} == expected
    # nothing was written: the tracked version is still the first one
    assert current_version(repo, "data") == first.version


def test_the_split_that_froze_the_pinned_set_passes(pinned_repo, tmp_path):
    source, repo, first = pinned_repo
    guard, _ = _guard(repo, tmp_path / "check.json")
    fresh = write_demo_dataset(
        tmp_path / "fresh", n_pairs=300, n_scored=50, seed=1, eval_fraction=EVAL_FRACTION, phrasings=6
    )
    second = add_dataset(
        fresh["demo"],
        DataConfig(eval_fraction=EVAL_FRACTION),
        repo_dir=repo,
        push=False,
        check_training=guard,
    )
    assert second.version != first.version and not second.reused


def test_a_version_made_without_the_check_is_checked_when_reused(pinned_repo, tmp_path):
    source, repo, _ = pinned_repo
    reseeded = DataConfig(eval_fraction=EVAL_FRACTION, split_seed=1)
    made = add_dataset(source, reseeded, repo_dir=repo, push=False)  # `data add` knows no pinned set
    guard, _ = _guard(repo, tmp_path / "check.json")
    with pytest.raises(PinnedSetContamination) as raised:
        add_dataset(source, reseeded, repo_dir=repo, push=False, check_training=guard)
    assert raised.value.clashes and all(c.file.endswith("train.parquet") for c in raised.value.clashes)
    assert current_version(repo, "data") == made.version


# ---------------------------------------------------------------- the label check cannot be skipped


def _scorer(prompts, completions):
    """A stand-in champion reward model that knows the demo's sums and format."""
    import re

    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        right = str(sum(int(x) for x in re.findall(r"\d+", prompt)))
        out.append(2.0 * ("The answer is" in completion) + (re.findall(r"-?\d+", completion)[:1] == [right]))
    return out


def test_a_half_flipped_file_added_then_reused_still_stops_on_its_labels(tmp_path, monkeypatch):
    import alignflow.models.reward_scorer as reward_scorer

    monkeypatch.setattr(reward_scorer, "load_reward_scorer", lambda *a, **k: _scorer)
    source = write_demo_dataset(tmp_path / "in", n_pairs=300, n_scored=0)["pairs"]
    rng = random.Random(0)
    flipped = tmp_path / "half-flipped.jsonl"
    with flipped.open("w") as out:
        for line in source.read_text().splitlines():
            row = json.loads(line)
            if rng.random() < 0.5:
                row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
            out.write(json.dumps(row) + "\n")
    repo = tmp_path / "repo"
    added = add_dataset(flipped, repo_dir=repo, push=False)  # `data add`: no champion judged it
    guard = label_guard("champion-reward", 0.98, 0.25, tmp_path / "label-check.json")
    with pytest.raises(LabelDisagreement) as raised:
        add_dataset(flipped, repo_dir=repo, push=False, check_labels=guard)  # `run`: the reused version
    assert raised.value.check.agreement.high < 0.73
    written = json.loads((tmp_path / "label-check.json").read_text())
    assert written["pairs"] == added.counts["train"] + added.counts["eval"], "every pair of the version"
    assert 0 < written["agreement"]["n"] <= written["pairs"], "judged where the answers decide"


def test_data_add_refuses_a_version_that_would_train_on_the_pinned_set(pinned_repo, tmp_path):
    from typer.testing import CliRunner

    from alignflow.cli import app

    source, repo, first = pinned_repo
    sets = [
        "--set",
        "data.eval_fraction=0.2",
        "--set",
        f"tracking.uri=sqlite:///{tmp_path / 'no-registry.db'}",
    ]
    args = ["data", "add", str(source), "--repo", str(repo), "--no-push", *sets]
    refused = CliRunner().invoke(app, [*args, "--set", "data.split_seed=1"])
    assert refused.exit_code == 1, refused.output
    assert PINNED_PROMPT_IN_TRAINING in refused.output and "demo.jsonl:" in refused.output
    assert current_version(repo, "data") == first.version
    assert not (tmp_path / "no-registry.db").exists(), "no tracking store is created to find no champion"
    assert CliRunner().invoke(app, args).exit_code == 0  # the split that froze the pinned set is fine


def test_evaluation_refuses_to_score_on_pinned_rows_the_snapshot_trained_on(tmp_path):
    from alignflow.data.snapshot import write_split
    from alignflow.evaluation.evaluate import refuse_trained_on

    pinned = [{"prompt": make_prompt(7, 8), "metadata": {"answer": 15}}]
    snapshot = tmp_path / "data"
    honest = {
        "kind": "pair",
        "prompt": make_prompt(7, 8, 1),
        "chosen": "The answer is 15.",
        "rejected": "I think 3",
    }
    write_split(snapshot, "train", [honest])
    refuse_trained_on(snapshot, pinned)  # another phrasing is no clash
    write_split(snapshot, "train", [honest, {**honest, "prompt": make_prompt(7, 8)}])
    with pytest.raises(PinnedSetContamination, match=r"train\.parquet:1 \[prompt\]"):
        refuse_trained_on(snapshot, pinned)
