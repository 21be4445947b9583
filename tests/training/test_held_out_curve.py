"""GRPO scores its held-out prompts every ``eval_every`` steps, logs the curve beside the
training figures, and hands on the best step it measured (the start when none beat it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from alignflow.training import held_out_best

pytestmark = pytest.mark.slow
WRECKING = ("grpo.max_steps=4", "grpo.eval_every=2", "grpo.learning_rate=0.05", "grpo.eval_max_rows=16")


@pytest.fixture
def curve_points(monkeypatch) -> dict[int, float]:
    """The held-out score by step (``eval/reward``, ``eval/task_accuracy``), as the stage logs
    it to MLflow."""
    points: dict[int, float] = {}

    def log_metrics(metrics, step=None):
        for key in ("eval/reward", "eval/task_accuracy"):
            if key in metrics:
                points[step] = metrics[key]

    monkeypatch.setattr(held_out_best.tracking, "log_metrics", log_metrics)
    return points


def test_grpo_hands_on_its_best_held_out_step_and_says_which(
    demo_config, demo_snapshot, sft_result, tmp_path, curve_points
):
    from alignflow.training.grpo import run_grpo

    config = demo_config(*WRECKING, "grpo.save_steps=1000")
    result = run_grpo(config, demo_snapshot, tmp_path / "best", model_path=sft_result.model_dir)
    assert sorted(curve_points) == [0, 2, 4], "the start, then every eval_every steps"
    assert curve_points[0] == result.metrics["eval/before_reward"]
    scores = dict(curve_points)
    best = max(scores, key=lambda step: (scores[step], -step))  # a tie goes to the earlier step
    assert best != 4, f"a wrecking learning rate: the last step is not the best ({scores})"
    assert result.metrics["handed_on_step"] == best
    assert result.metrics["eval/reward"] == pytest.approx(scores[best])  # the handed-on policy, scored again
    if best == 0:
        handed = load_file(Path(result.model_dir) / "model.safetensors")
        start = load_file(Path(sft_result.model_dir) / "model.safetensors")
        assert all(torch.equal(handed[k], start[k]) for k in start)

    curve_points.clear()
    last = run_grpo(
        demo_config(*WRECKING, "grpo.save_steps=1000", "grpo.hand_on=last"),
        demo_snapshot,
        tmp_path / "last",
        model_path=sft_result.model_dir,
    )
    assert last.metrics["handed_on_step"] == 4
    assert last.metrics["eval/reward"] == pytest.approx(curve_points[4])


def test_without_eval_every_grpo_hands_on_its_last_step(demo_config, demo_snapshot, sft_result, tmp_path):
    from alignflow.training.grpo import run_grpo

    config = demo_config("grpo.max_steps=2", "grpo.save_steps=1000", "grpo.eval_max_rows=4")
    result = run_grpo(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
    assert "handed_on_step" not in result.metrics and result.metrics["global_step"] == 2


def test_dpo_scores_answers_every_eval_every_steps_and_hands_on_the_best(
    demo_config, demo_snapshot, sft_result, tmp_path, curve_points
):
    """The demo's eval prompts carry answers: DPO's curve is their greedy task accuracy."""
    from alignflow.training.dpo import run_dpo

    wrecking = ("dpo.max_steps=4", "dpo.eval_every=2", "dpo.learning_rate=0.05", "dpo.eval_max_rows=16")
    result = run_dpo(
        demo_config(*wrecking, "dpo.save_steps=1000"),
        demo_snapshot,
        tmp_path,
        model_path=sft_result.model_dir,
    )
    assert sorted(curve_points) == [0, 2, 4], curve_points
    accuracy = dict(curve_points)
    assert accuracy[4] < accuracy[0], f"a wrecking learning rate wrecks the answers ({accuracy})"
    best = max(accuracy, key=lambda step: (accuracy[step], -step))
    assert result.metrics["handed_on_step"] == best != 4
    if best == 0:  # the SFT start answered better than any step measured
        weights = load_file(Path(result.model_dir) / "model.safetensors")
        start = load_file(Path(sft_result.model_dir) / "model.safetensors")
        assert all(torch.equal(weights[k], start[k]) for k in start)
