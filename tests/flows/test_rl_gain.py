"""The RL stage's own contribution through the retraining flow: the demo made tiny.

The adversarial case: after an SFT model that states sums, a DPO step whose learning rate
cannot move a float32 weight leaves the policy its SFT start. Judged against its RL start
(not the base model: ``evaluation.reference: base``) it gains exactly nothing, and
``promotion.min_rl_gain`` refuses it. The run summary, the version's page and the
evaluation report say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from alignflow.cli.pipeline import console, render_summary
from alignflow.evaluation import metric_names as names
from alignflow.evaluation.report import read_report
from alignflow.evaluation.rl_stage import NOTHING_MEASURABLE
from alignflow.flows.retrain import retrain
from tests.flows.conftest import TINY_FLOW

pytestmark = pytest.mark.slow
RL_DID_NOTHING = [
    *TINY_FLOW,
    "project=rl-gain-demo",
    # an SFT model that states sums ("I think 6"; the demo's DPO teaches the required format),
    # as in tests/flows/conftest.py's FAST_OVERRIDES
    "sft.max_steps=250",
    "sft.learning_rate=0.003",
    "evaluation.reference=base",
    "dpo.max_steps=1",
    "dpo.learning_rate=1e-30",  # 0.02 + 1e-30 is 0.02 in float32: the policy stays its SFT model
    "promotion.min_rl_gain=0.01",
]


def test_a_policy_that_rl_left_as_its_sft_start_is_refused_and_every_report_says_why(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = retrain(None, [*RL_DID_NOTHING, f"tracking.uri={uri}"], repo_dir=str(tmp_path))
    evaluated = next(s for s in summary["stages"] if s["name"] == "evaluate")
    metrics = evaluated["metrics"]
    assert metrics[names.RL_START_IS_REFERENCE] == 0.0, "the reference is the base model, the start SFT's"
    assert metrics[names.RL_START_TASK_ACCURACY] == metrics[names.TASK_ACCURACY]
    assert [metrics[names.RL_GAIN + s] for s in ("", "/low", "/high")] == [0.0, 0.0, 0.0]
    assert metrics[names.LENGTH_GROWTH_VS_RL_START] == 1.0, "the same completions as its start"

    policy = summary["promotions"]["policy"]
    assert not policy["promoted"] and policy["failed"] == ["rl_gain"]
    [gate] = [g for g in policy["gates"] if g["name"] == "rl_gain"]
    assert gate["describe"].startswith("rl_gain: 0 [0, 0] n=16, lower bound needs >= 0.01")
    assert "policy vs its RL start; its start is the SFT model it was trained from" in gate["describe"]

    said = f"{NOTHING_MEASURABLE}: task accuracy gain +0.000 [0.000, 0.000] n=16 (task accuracy "
    assert summary["rl_stage"].startswith(said)
    with console.capture() as shown:
        render_summary(summary)
    text = " ".join(shown.get().split())  # the console wraps at its width
    assert summary["rl_stage"] in text and "policy vs its RL start" in text

    page = MlflowClient(uri).get_model_version(policy["name"], policy["version"]).description
    assert f"- {summary['rl_stage']}" in page
    assert "| rl_gain | 0 | [0, 0] | 16 | lower bound >= 0.01 | **failed** |" in page

    report = Path(evaluated["output"]["report"])
    samples = read_report(report).samples
    assert all(row["policy"] for row in samples), "the SFT model's own words"
    assert [row["rl_start"] for row in samples] == [row["policy"] for row in samples]
    markdown = report.with_suffix(".md").read_text(encoding="utf-8")
    assert f"## What the RL stage added\n\n{summary['rl_stage']}" in markdown
