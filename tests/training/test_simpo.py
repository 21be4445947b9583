"""SimPO as a policy algorithm of its own: its config section, ``alignflow train simpo``,
``policy.algorithm: simpo``, and that it learns the demo's preferences from the SFT model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.config import ConfigError, load_config
from alignflow.training.registry import policy_algorithms, stage_spec
from alignflow.training.simpo_config import SimPOConfig


def test_simpo_is_a_policy_algorithm_with_its_own_section_and_cache_key():
    from alignflow.plan import RunPlan
    from alignflow.training.feedback_plan import FeedbackCounts, plan_for

    assert "simpo" in policy_algorithms()
    spec = stage_spec("simpo")
    assert spec.needs_pairs and spec.distributed and spec.cache_sections == ("seed", "model", "simpo")
    config = load_config(None, ["policy.algorithm=simpo", "simpo.gamma=0.5", "simpo.cpo_alpha=0.2"])
    assert isinstance(config.section(config.policy.algorithm), SimPOConfig)
    assert (config.simpo.gamma, config.simpo.cpo_alpha, config.simpo.beta) == (0.5, 0.2, 2.0)
    assert RunPlan(config).sections("policy") == ("policy", "seed", "model", "simpo")
    retuned = load_config(None, ["policy.algorithm=simpo", "simpo.gamma=0.8"])
    other_dpo = load_config(None, ["policy.algorithm=simpo", "dpo.beta=0.5"])
    assert RunPlan(retuned).section_hash("policy") != RunPlan(config).section_hash("policy")
    plain = load_config(None, ["policy.algorithm=simpo"])
    assert RunPlan(other_dpo).section_hash("policy") == RunPlan(plain).section_hash("policy")
    plan = plan_for(FeedbackCounts(pairwise=10), "simpo")
    assert plan.run_sft and "policy.algorithm=simpo" in plan.overrides()
    with pytest.raises(ValueError, match="needs preference pairs"):
        plan_for(FeedbackCounts(scored=10), "simpo")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("simpo.beta=0", r"simpo\.beta"),
        ("simpo.gamma=-0.1", r"simpo\.gamma"),
        ("simpo.cpo_alpha=-1", r"simpo\.cpo_alpha"),
        ("simpo.label_smoothing=0.5", r"simpo\.label_smoothing"),
        ("simpo.max_prompt_length=128", r"max_prompt_length \(128\) must be below simpo\.max_length \(128\)"),
        ("simpo.loss_type=sigmoid", r"simpo\.loss_type"),  # SimPO is its loss: no other to pick
    ],
)
def test_a_bad_simpo_value_is_refused_naming_its_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["policy.algorithm=simpo", override])


def test_the_prompt_keeps_its_end_and_batches_are_grouped_by_length(demo_snapshot, tiny_model_dir, tmp_path):
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from alignflow.data.pairing import load_pairs
    from alignflow.training.dpo import pair_dataset
    from alignflow.training.simpo import build_trainer

    config = load_config(None, ["simpo.max_prompt_length=6", "simpo.eval_max_rows=8"])
    trainer = build_trainer(config, 0, demo_snapshot, tmp_path, model_path=tiny_model_dir)
    rows = trainer.train_dataset
    assert max(len(ids) for ids in rows["prompt_input_ids"]) == 6, "BOS included"
    answers = zip(rows["chosen_input_ids"], rows["rejected_input_ids"], rows["prompt_input_ids"], strict=True)
    assert all(min(len(c), len(r)) > len(p) for c, r, p in answers), "every row keeps answer tokens"
    full = pair_dataset(load_pairs(demo_snapshot, "train"), trainer.processing_class)["prompt"]
    assert all(whole.endswith(cut) for whole, cut in zip(full, rows["prompt"], strict=True))
    assert sum(len(cut) < len(whole) for whole, cut in zip(full, rows["prompt"], strict=True)) > 0
    assert isinstance(trainer._get_train_sampler(), LengthGroupedSampler)
    assert len(trainer.eval_dataset) == 8


@pytest.mark.slow
def test_simpo_learns_the_preference_from_its_sft_model(sft_result, demo_snapshot, demo_config, tmp_path):
    from alignflow.training.simpo import run_simpo

    config = demo_config("simpo.max_steps=40", "simpo.save_steps=1000", "simpo.eval_max_rows=64")
    result = run_simpo(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
    m = result.metrics
    assert m["global_step"] == 40.0 and m["train_loss"] > 0
    # held-out pairs, measured: loss 0.79 -> 0.64, margin 1.30 -> 1.65, accuracy 0.95 -> 0.98
    # (simpo.seed 1-3: loss 0.65, margin 1.62-1.64, accuracy 0.97-0.98)
    assert m["eval/loss"] < 0.9 * m["eval/before_loss"], m
    assert m["eval/rewards/margins"] > m["eval/before_rewards/margins"] + 0.2, m
    assert m["eval/rewards/accuracies"] >= m["eval/before_rewards/accuracies"], m
    assert json.loads((tmp_path / "result.json").read_text())["stage"] == "simpo"


@pytest.mark.slow
def test_alignflow_train_simpo_trains_and_resumes(demo_snapshot, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # each run's log goes to the working directory's .alignflow/logs
    out = tmp_path / "out"

    def train(steps: int) -> dict:
        sets = [
            "--set",
            f"simpo.max_steps={steps}",
            "--set",
            "simpo.save_steps=2",
            "--set",
            "simpo.eval_max_rows=16",
        ]
        result = CliRunner().invoke(
            app,
            ["train", "simpo", "--data", str(demo_snapshot), "--output", str(out),
             "--model", str(tiny_model_dir), *sets, "--quiet"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout[result.stdout.index("{") :])

    first = train(2)
    assert first["stage"] == "simpo" and first["metrics"]["global_step"] == 2.0
    assert {"eval/before_rewards/accuracies", "eval/rewards/accuracies", "eval/loss"} <= set(first["metrics"])
    assert (out / "model" / "model.safetensors").exists()
    again = train(3)  # picks up the step-2 checkpoint and trains one more step
    assert again["metrics"]["global_step"] == 3.0
    assert json.loads((out / "result.json").read_text())["resumed_from"].endswith("checkpoint-2")
    assert "simpo" in CliRunner().invoke(app, ["train", "--help"]).stdout
