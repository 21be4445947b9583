"""``alignflow eval policy`` on a small prompt file with tiny policies built offline."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from alignflow.cli import app

runner = CliRunner()
QUICK = ["--set", "evaluation.max_new_tokens=6", "--set", "evaluation.kl_samples=4"]


@pytest.fixture(scope="module")
def other_policy_dir(tiny_model_dir, tmp_path_factory):
    """A second tiny policy on the same tokenizer (other initial weights): an opponent with KL."""
    from transformers import AutoTokenizer

    from alignflow.models.factory import init_tiny_model
    from alignflow.models.model_config import ModelSpec

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return init_tiny_model(tokenizer, tmp_path_factory.mktemp("other-policy"), ModelSpec(seed=1))


@pytest.fixture
def prompts_file(tmp_path):
    rows = [{"prompt": f"What is {i} plus {i + 2}?", "answer": 2 * i + 2} for i in range(10)]
    rows.append({"prompt": "What is the capital of France?", "answer": "Paris"})
    rows.append({"prompt": "  "})  # quarantined: an empty prompt
    rows.append({"prompt": "Say hello."})  # no answer: judged by the reward model only
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_policy_against_another_with_two_judges(
    tiny_model_dir, other_policy_dir, reward_model_dir, prompts_file, tmp_path
):
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["eval", "policy", "--model", str(tiny_model_dir), "--data", str(prompts_file),
         "--against", str(other_policy_dir), "--reward-model", str(reward_model_dir),
         "--output", str(out), *QUICK],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert report["judges"] == ["answer", "reward"]
    assert (report["rows"]["read"], report["rows"]["scored"], report["rows"]["quarantined"]) == (13, 12, 1)
    assert report["rows"]["quarantined_by_reason"] == {"empty_field": 1}
    # every prompt judged by the reward model, those with answers by the answer judge
    assert m["reward/win_rate_vs_against/n"] == 12.0 and m["answer/win_rate_vs_against/n"] == 11.0
    rate = m["reward/win_rate_vs_against"]
    assert 0.0 <= m["reward/win_rate_vs_against/low"] <= rate <= m["reward/win_rate_vs_against/high"] <= 1.0
    assert m["task_accuracy/n"] == 11.0 and 0.0 <= m["task_accuracy"] <= 1.0
    assert m["task_accuracy/low"] <= m["task_accuracy"] <= m["task_accuracy/high"]
    assert "against_task_accuracy" in m and "task_accuracy_gain/low" in m and "length_growth_ratio" in m
    assert m["kl_to_against"] is not None and m["length_mean"] >= 0.0 and "reward_mean" in m
    assert report["against"]["path"] == str(other_policy_dir) and report["tracking"] is None
    assert report["samples"] and {"prompt", "policy", "against", "verdict/reward_vs_against"} <= set(
        report["samples"][0]
    )
    assert "reward/win_rate_vs_against" in result.output
    assert "## Metrics" in (out / "report.md").read_text()


def test_policy_alone_reports_task_accuracy(tiny_model_dir, prompts_file, tmp_path):
    out = tmp_path / "out"
    args = ["eval", "policy", "--model", str(tiny_model_dir), "--data", str(prompts_file)]
    result = runner.invoke(app, [*args, "--output", str(out), *QUICK], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    m = json.loads((out / "report.json").read_text())["metrics"]
    assert m["task_accuracy/n"] == 11.0 and m["answers"] == 11.0
    assert not any("win_rate" in k for k in m)


def test_reward_judge_without_a_reward_model_is_a_usage_error(tiny_model_dir, prompts_file):
    args = ["eval", "policy", "--model", str(tiny_model_dir), "--data", str(prompts_file)]
    assert runner.invoke(app, [*args, "--judge", "reward"]).exit_code == 2


@pytest.mark.slow
def test_registered_policy_evaluation_is_logged_on_its_version(
    tiny_model_dir, other_policy_dir, prompts_file, tmp_path, monkeypatch
):
    import mlflow
    from mlflow import MlflowClient

    from alignflow.registry import models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # tracking configured through the environment
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("demo", str(tmp_path / "art"))
    with mlflow.start_run(experiment_id=experiment):  # not set_experiment: later tests get a fresh store
        logged = models.log_model(tiny_model_dir, uri, "demo-policy")
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["eval", "policy", "--model", "models:/demo-policy@challenger", "--data", str(prompts_file),
         "--against", str(other_policy_dir), "--output", str(out), *QUICK],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["version"] == logged.version and report["tracking"]["run_id"]
    logged_model = MlflowClient(uri).get_logged_model(report["model"]["model_id"])
    on_bench = {m.key: m.value for m in logged_model.metrics if m.run_id == report["tracking"]["run_id"]}
    assert on_bench["prompts/answer/win_rate_vs_against"] == report["metrics"]["answer/win_rate_vs_against"]
    assert on_bench["prompts/task_accuracy/n"] == 11.0


def test_prompts_longer_than_a_gpt2_policy_reads_are_cut_and_noted(gpt2_policy_dir, tmp_path):
    """A learned position table (GPT-2, OPT) used to crash generation on a long prompt (exit 3)."""
    data, out = tmp_path / "long.jsonl", tmp_path / "out"
    rows = [{"prompt": "Read this first. " * 40 + "What is 2 plus 3?", "answer": 5}, {"prompt": "Hi?"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = runner.invoke(
        app,
        ["eval", "policy", "--model", str(gpt2_policy_dir), "--data", str(data), "--output", str(out),
         "--against", str(gpt2_policy_dir), *QUICK],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["rows"]["scored"] == 2 and report["metrics"]["task_accuracy/n"] == 1.0
    cut = [n for n in report["notes"] if "prompts were longer than" in n]
    assert cut == [
        "1 of 2 prompts were longer than the policy reads (48 positions less max_new_tokens 6): "
        "each was cut to its last 42 tokens",
        "1 of 2 prompts were longer than the --against model reads (48 positions less max_new_tokens 6): "
        "each was cut to its last 42 tokens",
    ]
