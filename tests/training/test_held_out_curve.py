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
    """``eval/reward`` by step, as the stage logs it to MLflow."""
    points: dict[int, float] = {}

    def log_metrics(metrics, step=None):
        if "eval/reward" in metrics:
            points[step] = metrics["eval/reward"]

    monkeypatch.setattr(held_out_best.tracking, "log_metrics", log_metrics)
    return points


def test_grpo_hands_on_its_best_held_out_step_and_says_which(
    demo_config, demo_snapshot, sft_result, tmp_path, curve_points
):
    from alignflow.training.grpo import run_grpo

    config = demo_config(*WRECKING, "grpo.save_steps=1000")
    result = run_grpo(config, demo_snapshot, tmp_path / "best", model_path=sft_result.model_dir)
    assert sorted(curve_points) == [2, 4], "scored every eval_every steps"
    scores = {0: result.metrics["eval/before_reward"], **curve_points}
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
