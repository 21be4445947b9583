"""A run whose loss or weights go NaN stops with a clear error and hands on no model.

Before, transformers replaced each NaN loss by the average of earlier ones: a reward run
that diverged at step 3 reported a training loss of 0.07 and saved NaN weights, which the
next stage or the evaluation then refused far from the cause.
"""

from __future__ import annotations

import math

import pytest

from alignflow.training.checkpoints import TrainingDiverged
from alignflow.training.reward import run_reward

# no gradient clipping and a learning rate of 1000: the tiny reward model's loss is NaN by step 3
DIVERGING = ("reward.learning_rate=1000", "reward.extra_args.max_grad_norm=0", "reward.save_steps=1000")


def test_a_nan_loss_stops_the_run_at_its_step_and_no_model_is_saved(demo_config, demo_snapshot, tmp_path):
    config = demo_config(*DIVERGING, "reward.max_steps=20", "reward.logging_steps=1")
    with pytest.raises(TrainingDiverged, match=r"training loss is nan at step \d+ .*lower the learning rate"):
        run_reward(config, demo_snapshot, tmp_path)
    assert not (tmp_path / "model").exists()


def test_nan_weights_are_not_saved_when_no_loss_was_logged(demo_config, demo_snapshot, tmp_path):
    # no logging step inside the run: the weights are the last check before the model is handed on
    config = demo_config(*DIVERGING, "reward.max_steps=10", "reward.logging_steps=100")
    with pytest.raises(TrainingDiverged, match=r"NaN or infinite weights in \d+ tensors .*not saved"):
        run_reward(config, demo_snapshot, tmp_path)
    assert not (tmp_path / "model").exists()


def test_a_healthy_run_logs_finite_losses_and_saves(demo_config, demo_snapshot, tmp_path):
    config = demo_config("reward.max_steps=10", "reward.logging_steps=1", "reward.save_steps=1000")
    result = run_reward(config, demo_snapshot, tmp_path)
    assert math.isfinite(result.metrics["train_loss"]) and (tmp_path / "model").is_dir()


def test_the_ppo_stage_does_not_save_a_nan_policy(tiny_model_dir, tmp_path):
    """PPO saves through its own loop: the same refusal guards it (a stand-in trainer holds a real model)."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from alignflow.training.ppo import save_policy

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        next(policy.parameters())[0, 0] = float("nan")
    trainer = SimpleNamespace(
        model=SimpleNamespace(base_model=policy),
        tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
        iteration=7,
    )
    with pytest.raises(
        TrainingDiverged,
        match=r"trained at step 7: NaN or infinite weights in \d+ tensors \(model.embed_tokens.weight",
    ):
        save_policy(trainer, tmp_path)
    assert not (tmp_path / "model").exists()
