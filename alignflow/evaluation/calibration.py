"""How far a reward model's Bradley-Terry probabilities can be trusted.

A reward model that ranks pairs well can still be badly calibrated: it may say 0.99 where
it is right 70% of the time. Downstream users (PPO/GRPO reward scaling, promotion gates,
best-of-n sampling) read the probability, not just the ranking, so the reward stage
reports the expected calibration error (ECE) next to accuracy and margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


def bradley_terry_probability(
    chosen: Sequence[float] | np.ndarray, rejected: Sequence[float] | np.ndarray
) -> np.ndarray:
    """P(chosen beats rejected) = sigmoid(r_chosen - r_rejected), computed stably."""
    margin = np.asarray(chosen, dtype=np.float64) - np.asarray(rejected, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * margin))


def expected_calibration_error(
    probabilities: Sequence[float] | np.ndarray, outcomes: Sequence[bool | int] | np.ndarray, n_bins: int = 10
) -> float:
    """ECE of binary predictions: bin by confidence, weight |accuracy - confidence| by bin size.

    ``probabilities`` are P(outcome is True). Each prediction is the likelier side, its
    confidence ``max(p, 1 - p)``; equal-width bins over [0.5, 1]. NaN when any probability is
    NaN: such a prediction falls in no bin, and leaving it out would call a broken model calibrated.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(outcomes, dtype=bool)
    if p.shape != y.shape:
        raise ValueError(f"probabilities {p.shape} and outcomes {y.shape} differ in shape")
    if p.size == 0:
        raise ValueError("expected_calibration_error needs at least one prediction")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if np.isnan(p).any():
        return float("nan")
    predicted = p >= 0.5
    confidence = np.where(predicted, p, 1.0 - p)
    correct = predicted == y
    # map confidence in [0.5, 1] to a bin index 0..n_bins-1
    index = np.minimum(((confidence - 0.5) * 2.0 * n_bins).astype(int), n_bins - 1)
    ece = 0.0
    for b in range(n_bins):
        in_bin = index == b
        if in_bin.any():
            ece += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(ece)


@dataclass(frozen=True)
class PairwiseRewardReport:
    """What a reward model says about held-out pairs; ``as_metrics`` gives flat names."""

    accuracy: float
    margin_mean: float
    ece: float
    reward_mean: float
    reward_std: float
    n_pairs: int

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in asdict(self).items()}


def pairwise_report(
    chosen: Sequence[float], rejected: Sequence[float], n_bins: int = 10
) -> PairwiseRewardReport:
    """Accuracy, mean margin, ECE of the Bradley-Terry probability and reward mean/std.

    The reward mean/std are over both sides of every pair: the statistics downstream
    stages use to normalise rewards to zero mean and unit variance.
    """
    c = np.asarray(chosen, dtype=np.float64)
    r = np.asarray(rejected, dtype=np.float64)
    if c.shape != r.shape or c.ndim != 1:
        raise ValueError(f"chosen {c.shape} and rejected {r.shape} must be equal-length 1-D sequences")
    if c.size == 0:
        raise ValueError("pairwise_report needs at least one pair")
    prob = bradley_terry_probability(c, r)
    both = np.concatenate([c, r])
    return PairwiseRewardReport(
        accuracy=float((c > r).mean()),
        margin_mean=float((c - r).mean()),
        ece=expected_calibration_error(prob, np.ones_like(prob, dtype=bool), n_bins=n_bins),
        reward_mean=float(both.mean()),
        reward_std=float(both.std()),
        n_pairs=int(c.size),
    )
