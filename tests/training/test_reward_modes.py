"""Reward models on ratings (regression) and on ratings and comparisons together (mixed)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from alignflow.data.demo import iter_demo_pairs, iter_demo_scored


@pytest.fixture(scope="module")
def mixed_snapshot(tmp_path_factory) -> Path:
    """Demo ratings and comparisons of disjoint prompts, split train/eval."""
    from alignflow.data.snapshot import write_split

    data_dir = tmp_path_factory.mktemp("mixed-snapshot")
    scored = [
        {**r, "kind": "scored", "completion": r.pop("response")} for r in iter_demo_scored(600, seed=11)
    ]
    pairs = [dict(r, kind="pair") for r in iter_demo_pairs(300, seed=12)]
    write_split(data_dir, "train", scored[:480] + pairs[:240])
    write_split(data_dir, "eval", scored[480:] + pairs[240:])
    return data_dir


def _held_out_fit(model_dir: str, data_dir: Path) -> tuple[float, float]:
    """(MSE of the predicted scores, variance of the true scores) on the eval ratings."""
    from alignflow.data.snapshot import load_split
    from alignflow.models.reward_scorer import load_reward_scorer

    rows = load_split(data_dir, "eval", kind="scored")
    scorer = load_reward_scorer(model_dir, normalize=False)
    predicted = scorer.raw([r["prompt"] for r in rows], [r["completion"] for r in rows])
    truth = [r["score"] for r in rows]
    mse = statistics.fmean((p - t) ** 2 for p, t in zip(predicted, truth, strict=True))
    return mse, statistics.pvariance(truth)


@pytest.mark.parametrize("mode", ["regression", "mixed"])
def test_reward_model_learns_the_ratings(mode, mixed_snapshot, sft_result, demo_config, tmp_path):
    from alignflow.training.reward import run_reward

    config = demo_config(f"reward.mode={mode}", "reward.max_steps=120", "reward.save_steps=1000")
    result = run_reward(config, mixed_snapshot, tmp_path, model_path=sft_result.model_dir)
    mse, variance = _held_out_fit(result.model_dir, mixed_snapshot)
    # clearly better than always predicting the mean score, on ratings it never saw
    assert mse < 0.75 * variance, (mse, variance)
    assert result.metrics["eval/mse"] == pytest.approx(mse, rel=1e-3)
    if mode == "mixed":  # the comparisons were learned too: above chance beyond the 95% interval
        from alignflow.evaluation.intervals import wilson

        m = result.metrics
        n = int(m["eval/n_pairs"])
        assert wilson(round(m["eval/accuracy"] * n), n).low > 0.5, m


def test_regression_needs_ratings(demo_snapshot, sft_result, demo_config, tmp_path):
    from alignflow.training.reward import run_reward

    config = demo_config("reward.mode=regression", "reward.max_steps=2")
    with pytest.raises(ValueError, match="no scored rows"):
        run_reward(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
