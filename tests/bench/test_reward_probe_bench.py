"""The reward-probe bench's learning curve: it rises with pairs where the features carry the
label, stays flat where they carry nothing, and its trend is read off the points it measured."""

from __future__ import annotations

import numpy as np

from alignflow.training.reward import log_length_differences
from bench.reward_probe_bench import CURVE_FRACTIONS, learning_curve

SETTINGS = {"view": {"l2": 0.01, "debias": 0.0}}


def _pairs(n: int) -> list[dict[str, str]]:
    return [{"chosen": "a" * (1 + i % 7), "rejected": "b" * (1 + (i * 3) % 5)} for i in range(n)]


def _views(signal: float, n_train: int = 160, n_held: int = 2000, dims: int = 20) -> dict:
    """chosen - rejected features whose first coordinate leans towards the chosen side by ``signal``
    and the rest is noise: a probe needs pairs to find that coordinate among the others."""
    rng = np.random.default_rng(0)

    def draw(n):
        x = rng.normal(size=(n, dims))
        x[:, 0] += signal
        return x

    return {"view": {"train": draw(n_train), "held_out": draw(n_held)}}


def _curve(signal: float) -> dict:
    train = _pairs(160)
    lengths = log_length_differences(train)
    held_lengths = np.resize(lengths, 2000)
    return learning_curve(_views(signal), SETTINGS, train, lengths, held_lengths)


def test_accuracy_grows_with_pairs_where_the_features_carry_the_label():
    curve = _curve(signal=0.5)
    points = curve["points"]
    assert [p["train_pairs"] for p in points] == [round(f * 160) for f in CURVE_FRACTIONS]
    assert points[-1]["draws"] == 1 and all(p["draws"] > 1 for p in points[:-1])
    assert points[-1]["held_out_accuracy"] > points[0]["held_out_accuracy"] + 0.03
    assert curve["gain_per_doubling"] > 0.01
    # the trend's count for the target lies beyond the pairs it was fitted on when the last point is below
    if points[-1]["held_out_accuracy"] < curve["target"]:
        assert curve["pairs_for_target_by_trend"] > 160


def test_features_of_noise_give_a_flat_curve_near_chance():
    curve = _curve(signal=0.0)
    assert all(abs(p["held_out_accuracy"] - 0.5) < 0.06 for p in curve["points"])
    assert abs(curve["gain_per_doubling"]) < 0.02
