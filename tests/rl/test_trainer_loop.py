"""The research trainers run on transformers' Trainer: its log read back, and no second loop."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from alignflow.rl.trainer_loop import (
    history_from_log,
    last_train_log,
    loop_arguments,
    optimizer_steps,
    without_eval_prefix,
)

LIBRARY = Path(__file__).resolve().parents[2] / "alignflow"

# Files that may step an optimiser themselves, and why. Everything else trains through a
# transformers/TRL Trainer.
OWN_LOOPS = {
    "rl/ppo.py": "the PPO engine, run by the research API and the pipeline's PPO stage alike",
    "rl/forward_backward.py": "spec 000's forward-backward API: the caller drives each step",
    "training/noisy_pairs.py": "a linear probe fitted with LBFGS, not a model being trained",
}


def test_no_module_outside_the_known_ones_steps_an_optimiser_itself():
    stepping = re.compile(r"\.backward\(|optimizer\.step\(|\.zero_grad\(")
    found = {
        path.relative_to(LIBRARY).as_posix()
        for path in LIBRARY.rglob("*.py")
        if stepping.search(path.read_text(encoding="utf-8"))
    }
    assert found == set(OWN_LOOPS), found


def test_history_merges_train_and_eval_logs_by_step_and_drops_the_summary():
    log = [
        {"loss": 0.7, "rewards/accuracies": 0.5, "epoch": 0.5, "step": 1},
        {"loss": 0.6, "rewards/accuracies": 0.6, "epoch": 1.0, "step": 2},
        {"eval_loss": 0.65, "eval_rewards/accuracies": 0.7, "eval_runtime": 0.1, "step": 2},
        {"train_runtime": 3.0, "train_loss": 0.65, "total_flos": 0.0, "step": 2},
    ]
    history = history_from_log(log)
    assert [row["step"] for row in history] == [1, 2]
    assert history[1]["loss"] == 0.6 and history[1]["eval/loss"] == 0.65
    assert "eval/loss" not in history[0] and "train_runtime" not in history[1]
    assert last_train_log(log) == {"loss": 0.6, "rewards/accuracies": 0.6, "epoch": 1.0}
    assert without_eval_prefix({"eval_loss": 0.65, "eval_runtime": 0.1, "eval_samples_per_second": 9.0}) == {
        "loss": 0.65
    }


def test_step_count_matches_trainers_rounding_of_a_partial_accumulation_round():
    assert optimizer_steps(400, 16, 2, 1) == 13  # 25 batches, the last round holds one
    assert optimizer_steps(400, 16, 1, 3) == 75
    assert optimizer_steps(3, 16, 4, 1) == 1
    args = loop_arguments(
        device=torch.device("cpu"),
        batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        seed=7,
        num_epochs=2,
    )
    assert args["use_cpu"] and args["report_to"] == "none" and args["seed"] == 7
