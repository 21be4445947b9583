"""``model.weights: random`` through the retraining flow: the demo made tiny, its model named by folder.

TINY_FLOW's gates are loose enough that a tiny model is crowned (tests/flows/test_retrain.py);
the same run started from random weights is trained, evaluated and registered like any, and
then refused, with the reason in the summary, on the version's page and in the registry.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from alignflow.cli.pipeline import console, render_summary
from alignflow.evaluation.cost import DEVICE_TAG, device_name
from alignflow.evaluation.metric_names import RANDOM_WEIGHTS
from alignflow.flows.retrain import retrain
from alignflow.registry.models import CHAMPION, version_by_alias
from alignflow.registry.runs import child_runs
from tests.flows.conftest import TINY_FLOW

pytestmark = pytest.mark.slow


def test_a_run_from_random_weights_trains_every_stage_says_so_and_crowns_nothing(tmp_path, tiny_model_dir):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = [*TINY_FLOW, "project=random-weights", f"model.name={tiny_model_dir}", "model.weights=random"]
    summary = retrain(None, [*settings, "sft.max_steps=4", "dpo.max_steps=2", f"tracking.uri={uri}"],
                      repo_dir=str(tmp_path))  # fmt: skip
    ran = {stage["name"] for stage in summary["stages"]}
    assert {"sft", "reward", "policy", "evaluate", "register", "promote"} <= ran
    assert summary["random_weights"].startswith(f"the run started from {tiny_model_dir}'s architecture")

    for role in ("policy", "reward"):
        decision = summary["promotions"][role]
        assert not decision["promoted"] and "trained_weights" in decision["failed"], decision
        assert version_by_alias(uri, decision["name"], CHAMPION) is None
    policy = summary["promotions"]["policy"]
    assert policy["failed"] == ["trained_weights"], "every other gate passes: the marker alone refuses it"
    client = MlflowClient(uri)
    page = client.get_model_version(policy["name"], policy["version"]).description
    assert "model.weights: random" in page
    judged_on = client.get_run(client.get_model_version(policy["name"], policy["version"]).run_id)
    assert judged_on.data.metrics[RANDOM_WEIGHTS] == 1.0
    assert client.get_run(summary["parent_run_id"]).data.params["model.weights"] == "random"

    # where each stage ran, as the runs record it (a GPU's name there; this CPU's here)
    runs = {run.info.run_name: run for run in child_runs(uri, summary["parent_run_id"])}
    for stage in ("sft", "reward", "policy", "evaluate"):
        assert runs[stage].data.tags[DEVICE_TAG] == device_name("cpu"), stage

    with console.capture() as shown:
        render_summary(summary)
    assert "Random weights:" in shown.get()
