"""The end-of-run table's key-metrics cell: what a person reads first after ``alignflow run``."""

from __future__ import annotations

from alignflow.flows.summary import key_metrics


def test_evaluate_row_leads_with_the_pinned_sets_task_accuracy_against_the_reference():
    metrics = {
        "eval/reward_margin": 3.7,
        "eval/kl_to_reference": 10.1,
        "eval/task_accuracy": 0.5,
        "golden/reference_task_accuracy": 0.0,
        "golden/task_accuracy": 0.946,
        "golden/task_accuracy/low": 0.9,
        "golden/task_accuracy/n": 130.0,
    }
    cell = key_metrics("evaluate", metrics)
    assert cell.startswith("pinned task_accuracy=0.946, pinned reference_task_accuracy=0, task_accuracy=0.5")
    assert "/low" not in cell and "/n" not in cell  # intervals live in the gate table, not here
    assert "reward_margin" not in cell  # headline metrics fill the cell before the rest


def test_reward_row_shows_held_out_accuracy_and_keeps_the_train_scope():
    metrics = {"train/accuracy": 0.739, "train_loss": 0.36, "eval/accuracy": 0.617, "eval/ece": 0.05}
    cell = key_metrics("reward", metrics)
    assert cell.startswith("accuracy=0.617, ece=0.05")
    assert "train/accuracy=0.739" in cell


def test_noise_is_left_out_of_other_rows():
    cell = key_metrics("sft", {"train_runtime": 8.2, "epoch": 2.9, "eval_loss": 0.524})
    assert cell == "eval_loss=0.524"


def test_counts_are_printed_as_integers():
    cell = key_metrics("data", {"data/train": 2030.0, "data/eval": 226.0, "data/quarantined": 0.0})
    assert cell == "data/train=2030, data/eval=226, data/quarantined=0"


def test_the_sft_row_leaves_out_runtime_noise():
    metrics = {
        "eval/model_preparation_time": 0.0021,
        "eval/loss": 1.234,
        "train_loss": 1.5,
        "eval/runtime": 0.4,
    }
    cell = key_metrics("sft", metrics)
    assert cell == "loss=1.23, train_loss=1.5"


def test_the_policy_row_shows_the_dpo_loss_and_margins_not_reference_cache_timings():
    metrics = {
        "reference/train_cached": 1.0,
        "reference/train_seconds": 3.2,
        "reference/eval_cached": 0.0,
        "reference/eval_seconds": 0.8,
        "train_loss": 0.61,
        "eval/loss": 0.52,
        "eval/rewards/margins": 1.31,
        "eval/rewards/accuracies": 0.9,
        "eval/rewards/chosen": 0.2,
    }
    cell = key_metrics("policy", metrics)
    assert cell.startswith("loss=0.52, rewards/margins=1.31, rewards/accuracies=0.9, train_loss=0.61")
    assert "reference/" not in cell
