"""A run whose loss or weights go NaN stops with a clear error and hands on no model.

Before, transformers replaced each NaN loss by the average of earlier ones: a reward run
that diverged at step 3 reported a training loss of 0.07 and saved NaN weights, which the
next stage or the evaluation then refused far from the cause.
"""

from __future__ import annotations

import math

import pytest

from alignflow.training.checkpoints import TrainingDiverged
from alignflow.training.reward import AlignflowRewardTrainer, run_reward

DIVERGES_AT = 3


@pytest.fixture()
def diverging(monkeypatch):
    """The reward loss turns NaN at step ``DIVERGES_AT``, whatever the CPU's arithmetic.

    A huge learning rate overflows on some machines and merely saturates the model on others
    (a loss stuck at 0.6931, zero gradients). Here the real loss is multiplied by NaN, so its
    gradients and, after the optimizer step, the weights are NaN too: the stage's own checks
    are what must catch it.
    """
    real = AlignflowRewardTrainer.compute_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result = real(self, model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step + 1 < DIVERGES_AT:  # the step being computed, counted from 1
            return result
        if return_outputs:
            loss, outputs = result
            return loss * math.nan, outputs
        return result * math.nan

    monkeypatch.setattr(AlignflowRewardTrainer, "compute_loss", compute_loss)


def test_a_nan_loss_stops_the_run_at_its_step_and_no_model_is_saved(
    diverging, demo_config, demo_snapshot, tmp_path
):
    config = demo_config("reward.max_steps=20", "reward.logging_steps=1", "reward.save_steps=1000")
    with pytest.raises(
        TrainingDiverged, match=rf"training loss is nan at step {DIVERGES_AT} .*lower the learning rate"
    ):
        run_reward(config, demo_snapshot, tmp_path)
    assert not (tmp_path / "model").exists()


def test_nan_weights_are_not_saved_when_no_loss_was_logged(diverging, demo_config, demo_snapshot, tmp_path):
    # no logging step inside the run: the weights are the last check before the model is handed on
    config = demo_config("reward.max_steps=10", "reward.logging_steps=100", "reward.save_steps=1000")
    weights = r"the model trained at step 10: NaN or infinite weights in \d+ tensors .*not saved"
    with pytest.raises(TrainingDiverged, match=weights):
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
