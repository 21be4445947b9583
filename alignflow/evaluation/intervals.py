"""95% intervals for the numbers promotion decides on.

A gate that reads a point estimate promotes a lucky model: 8 right answers out of 14 is
0.57, but so is anything between 0.33 and 0.79. These helpers turn per-row outcomes into
an :class:`Estimate` (value, bounds, rows), so a gate can ask that the *bound* clears
its threshold.

- :func:`wilson`: a share of 0/1 outcomes (task accuracy, reward-model accuracy, label agreement).
- :func:`bootstrap_mean`: a mean of per-row verdicts that may tie (win rates: 1, ½ or 0 a row;
  Wilson would treat a tie as a coin flip and overstate the spread when many rows tie).
- :func:`paired_bootstrap_difference`: the mean difference of two systems on the same rows
  (challenger minus champion), resampling rows so that the pairing is kept.
- :func:`paired_bootstrap_ratio`: the ratio of two means on the same rows (length growth).
- :func:`paired_difference`: the difference of two 0/1 shares on the same rows (a slice of the
  pinned set, challenger vs champion). Newcombe's hybrid score interval: sound for the handful
  of rows a slice holds, where a bootstrap of 3 flipped rows would claim a certain -1.
- :func:`disagreement` and :func:`items_to_tell`: the power behind a "not clearly worse" gate,
  i.e. how many pinned items a paired comparison needs to tell a given drop from a tie.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval and the number of rows behind it."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    method: str

    def as_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)

    def describe(self) -> str:
        if self.value is None:
            return f"n/a (n={self.n})"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] n={self.n}"


# an estimate stored flat among metrics: the value under its key, the interval and n beside it
BOUND_SUFFIXES = ("/low", "/high", "/n")


def is_bound_key(key: str) -> bool:
    """Whether a metric key is an interval bound or a row count, not a figure of its own."""
    return key.endswith(BOUND_SUFFIXES)


def put_estimate(metrics: dict[str, float | None], key: str, estimate: Estimate) -> None:
    """Store an estimate flat: the value under ``key``, its bounds and n beside it."""
    metrics[key] = estimate.value
    metrics[f"{key}/low"] = estimate.low
    metrics[f"{key}/high"] = estimate.high
    metrics[f"{key}/n"] = float(estimate.n)


def read_estimate(metrics: Mapping[str, float | None], key: str) -> Estimate | None:
    """An estimate stored by :func:`put_estimate`; None where any part of it is missing."""
    value, low, high, n = (metrics.get(key + suffix) for suffix in ("", *BOUND_SUFFIXES))
    if value is None or low is None or high is None or n is None:
        return None
    return Estimate(value, low, high, int(n), "stored")


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2)


def empty(method: str) -> Estimate:
    return Estimate(None, None, None, 0, method)


def wilson(successes: float, n: int, confidence: float = CONFIDENCE) -> Estimate:
    """Wilson score interval of a binomial share: sound near 0 and 1 and for small n."""
    if n <= 0:
        return empty("wilson")
    p, z = successes / n, _z(confidence)
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # clamp to the point: rounding would put 0/n's low bound a hair above 0 (and n/n's high below 1)
    return Estimate(p, max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)), n, "wilson")


def wilson_of(outcomes: Sequence[float | None], confidence: float = CONFIDENCE) -> Estimate:
    """:func:`wilson` over 0/1 outcomes, skipping rows that could not be judged (None)."""
    judged = [float(o) for o in outcomes if o is not None]
    return wilson(sum(judged), len(judged), confidence)


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """mean(a) - mean(b) of two independent groups (e.g. ratings of two served versions),
    with Welch's normal-approximation interval; ``n`` is the smaller group's size."""
    if len(a) < 2 or len(b) < 2:
        return Estimate(None, None, None, min(len(a), len(b)), "welch")
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    difference = float(xa.mean() - xb.mean())
    half = _z(confidence) * math.sqrt(xa.var(ddof=1) / xa.size + xb.var(ddof=1) / xb.size)
    return Estimate(difference, difference - half, difference + half, int(min(xa.size, xb.size)), "welch")


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _row_resamples(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_mean(
    values: Sequence[float | None],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """Percentile-bootstrap interval of a mean over rows (None rows are not judged)."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return empty("bootstrap")
    means = data[_row_resamples(data.size, resamples, seed)].mean(axis=1)
    low, high = _percentiles(means, confidence)
    return Estimate(float(data.mean()), low, high, int(data.size), "bootstrap")


def _paired(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    if len(a) != len(b):
        raise ValueError(f"paired rows needed: {len(a)} vs {len(b)} values")
    rows = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return np.asarray([r[0] for r in rows], dtype=float), np.asarray([r[1] for r in rows], dtype=float)


def _paired_bootstrap(
    a: Sequence[float | None],
    b: Sequence[float | None],
    statistic,
    confidence: float,
    resamples: int,
    seed: int,
) -> Estimate:
    """``statistic(x, y)`` over the rows judged on both sides, and its interval over row resamples."""
    x, y = _paired(a, b)
    if x.size == 0:
        return empty("paired_bootstrap")
    index = _row_resamples(x.size, resamples, seed)
    low, high = _percentiles(statistic(x[index], y[index]), confidence)
    return Estimate(float(statistic(x[None], y[None])[0]), low, high, int(x.size), "paired_bootstrap")


def paired_bootstrap_difference(
    a: Sequence[float | None],
    b: Sequence[float | None],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """Interval of mean(a) - mean(b) over the same rows, resampled together."""

    def difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return (x - y).mean(axis=1)

    return _paired_bootstrap(a, b, difference, confidence, resamples, seed)


def paired_bootstrap_ratio(
    a: Sequence[float | None],
    b: Sequence[float | None],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """Interval of mean(a) / mean(b) over the same rows (b's mean floored at 1, as lengths are)."""

    def ratio(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x.mean(axis=1) / np.maximum(y.mean(axis=1), 1.0)

    return _paired_bootstrap(a, b, ratio, confidence, resamples, seed)


def _pairing_correlation(both: int, only_a: int, only_b: int, neither: int) -> float:
    """The phi coefficient of a 2x2 paired table (0 when a margin is empty)."""
    denominator = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    return 0.0 if denominator == 0 else (both * neither - only_a * only_b) / math.sqrt(denominator)


def paired_difference(
    a: Sequence[float | None], b: Sequence[float | None], confidence: float = CONFIDENCE
) -> Estimate:
    """share(a) - share(b) of 0/1 outcomes on the same rows, with Newcombe's (1998, method 10)
    hybrid score interval: Wilson intervals of both shares, combined with their correlation.

    Rows judged on one side only are left out; ``n`` is the rows judged on both.
    """
    x, y = _paired(a, b)
    n = int(x.size)
    if n == 0:
        return empty("newcombe_paired")
    x, y = x > 0.5, y > 0.5
    counts = [int((x & y).sum()), int((x & ~y).sum()), int((~x & y).sum()), int((~x & ~y).sum())]
    share_a, share_b = (counts[0] + counts[1]) / n, (counts[0] + counts[2]) / n
    wa, wb = wilson(share_a * n, n, confidence), wilson(share_b * n, n, confidence)
    phi = _pairing_correlation(*counts)
    # n > 0, so both Wilson intervals are set
    assert wa.low is not None and wa.high is not None and wb.low is not None and wb.high is not None
    down_a, up_a, down_b, up_b = share_a - wa.low, wa.high - share_a, share_b - wb.low, wb.high - share_b
    difference = share_a - share_b
    low = difference - math.sqrt(max(0.0, down_a**2 - 2 * phi * down_a * up_b + up_b**2))
    high = difference + math.sqrt(max(0.0, up_a**2 - 2 * phi * up_a * down_b + down_b**2))
    return Estimate(difference, max(-1.0, low), min(1.0, high), n, "newcombe_paired")


def disagreement(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Share of rows judged on both sides where two systems' 0/1 outcomes differ.

    A paired difference's spread comes from these rows alone: two models that agree
    everywhere need few items to be told apart, two that flip many items need many.
    """
    x, y = _paired(a, b)
    return None if x.size == 0 else float(((x > 0.5) != (y > 0.5)).mean())


def items_to_tell(drop: float, disagree: float, power: float = 0.8, confidence: float = CONFIDENCE) -> int:
    """Paired items needed so that, with probability ``power``, a challenger tied with the
    champion shows a lower bound above ``-drop`` (and one a full ``drop`` worse does not
    pass by luck more often than the interval's tail), when the two disagree on a
    ``disagree`` share of items. Normal approximation of the paired difference, whose
    per-item variance under a tie is the disagreement share itself.
    """
    from statistics import NormalDist

    if drop <= 0:
        raise ValueError(f"drop must be positive, got {drop}")
    z = _z(confidence) + NormalDist().inv_cdf(power)
    return max(1, math.ceil(z * z * max(disagree, 0.0) / (drop * drop)))
