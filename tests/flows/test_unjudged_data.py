"""A scheduled (unattended) run on data no judge can judge stops before training and says why;
accepted with a reason (`data add --accept-unjudged`), it trains, and every model version
trained on it shows the reason (#47)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.data.demo import write_demo_dataset
from alignflow.flows.retrain import STOP_REASON_TAG, retrain
from alignflow.registry.runs import ACCEPTED_UNJUDGED_TAG
from tests.evaluation.label_check_cases import stand_in_champion
from tests.flows.conftest import TINY_FLOW

pytestmark = pytest.mark.slow
PROJECT = "unjudged"
TINY = [*TINY_FLOW, f"project={PROJECT}", "dpo.max_steps=4"]
REASON = "chat pairs hand-checked by two annotators (ticket 123)"


@pytest.fixture
def champion(monkeypatch):
    stand_in_champion(monkeypatch)


@pytest.fixture
def mixed_source(tmp_path, monkeypatch) -> Path:
    """The demo's rows (answers in metadata) and twenty chat pairs that nothing can verify; run
    from the test's folder (MLflow's local artifacts go under the working directory)."""
    monkeypatch.chdir(tmp_path)
    demo = write_demo_dataset(tmp_path / "in", n_pairs=400, n_scored=50)["demo"]
    chat = [
        {"prompt": f"Name colour number {i}.", "chosen": f"Colour {i} is blue.", "rejected": "A banana."}
        for i in range(20)
    ]
    source = tmp_path / "mixed.jsonl"
    source.write_text(demo.read_text() + "".join(json.dumps(r) + "\n" for r in chat), encoding="utf-8")
    return source


def _overrides(tmp_path: Path, source: Path) -> list[str]:
    return [*TINY, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"data.source={source}"]


def test_a_scheduled_run_on_unjudged_data_stops_before_training_and_says_why(
    champion, mixed_source, tmp_path
):
    repo = tmp_path / "repo"
    repo.mkdir()
    summary = retrain(None, _overrides(tmp_path, mixed_source), repo_dir=str(repo))
    stopped = summary["stopped"]
    assert stopped["reason"] == "cannot_judge", summary
    assert "new pairs cannot be judged" in stopped["message"]
    assert "metadata.answer" in stopped["message"] and "--accept-unjudged" in stopped["message"]
    assert {s["name"] for s in summary["stages"]} <= {"data"} and not summary["promotions"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(summary["parent_run_id"]).data.tags[STOP_REASON_TAG] == "cannot_judge"
    assert not client.search_model_versions(f"name='{PROJECT}-policy'"), "nothing trained or registered"
    report = json.loads(Path(stopped["report"]).read_text())
    assert report["status"] == "cannot_judge" and report["unjudged"]["pairs"] >= 20
    assert not (repo / "data.dvc").exists(), "nothing versioned"


def test_accepted_with_a_reason_it_trains_and_every_model_version_shows_the_reason(
    champion, mixed_source, tmp_path
):
    repo = tmp_path / "repo"
    repo.mkdir()
    overrides = _overrides(tmp_path, mixed_source)
    sets = [arg for item in overrides for arg in ("--set", item)]
    added = CliRunner().invoke(
        app,
        [
            "data",
            "add",
            str(mixed_source),
            "--repo",
            str(repo),
            "--no-push",
            *sets,
            "--accept-unjudged",
            REASON,
        ],
    )
    assert added.exit_code == 0, added.output
    summary = retrain(None, overrides, repo_dir=str(repo))
    assert summary.get("stopped") is None, summary.get("stopped")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(summary["parent_run_id"]).data.tags[ACCEPTED_UNJUDGED_TAG] == REASON
    versions = [
        v for role in ("policy", "reward") for v in client.search_model_versions(f"name='{PROJECT}-{role}'")
    ]
    assert len(versions) == 2
    for version in versions:
        assert version.tags[ACCEPTED_UNJUDGED_TAG] == REASON
        assert REASON in version.description
