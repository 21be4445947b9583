"""``policy.algorithm: simpo`` through the retraining flow: the demo made tiny, a few steps a stage.

Whether SimPO learns is ``tests/training/test_simpo.py``'s question; this one asks that the
flow runs it as its policy step from the SFT model, evaluates, registers and judges it.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from alignflow.flows.retrain import retrain
from alignflow.registry.runs import child_runs
from tests.flows.conftest import TINY_FLOW

pytestmark = pytest.mark.slow
TINY = [*TINY_FLOW, "project=simpo-demo", "policy.algorithm=simpo", "simpo.max_steps=4", "simpo.save_steps=2"]


def test_simpo_runs_as_the_flows_policy_step(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = retrain(None, [*TINY, f"tracking.uri={uri}"], repo_dir=str(tmp_path))
    by_name = {stage["name"]: stage for stage in summary["stages"]}
    assert {"sft", "reward", "policy", "evaluate", "register", "promote"} <= set(by_name)
    policy = by_name["policy"]["metrics"]
    assert policy["global_step"] == 4.0 and "eval/rewards/accuracies" in policy, policy
    assert "policy" in summary["promotions"], "evaluated, registered and judged like any policy"
    parent = MlflowClient(uri).get_run(summary["parent_run_id"])
    assert parent.info.run_name.startswith("simpo-demo-simpo-")
    assert parent.data.params["policy.algorithm"] == "simpo" and parent.data.params["simpo.gamma"] == "1.0"
    run = next(r for r in child_runs(uri, summary["parent_run_id"]) if r.info.run_name == "policy")
    assert "simpo/eval/rewards/accuracies" in run.data.metrics, sorted(run.data.metrics)
