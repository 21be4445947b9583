"""GRPO scores its held-out prompts every ``eval_every`` steps, logs the curve beside the
training figures, and hands on the best step it measured (the start when none beat it)."""

from __future__ import annotations

import pytest

from alignflow.training import held_out_best
from tests.training.held_out_checks import assert_hands_on_the_best_step

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
    start = sft_result.model_dir
    assert_hands_on_the_best_step(result.metrics, scores, result.model_dir, start, rescored="eval/reward")

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
    assert_hands_on_the_best_step(result.metrics, accuracy, result.model_dir, sft_result.model_dir)
