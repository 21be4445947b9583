"""What the RL stage itself added over the model it started from, said in one line.

A run can gain a lot over its base model and owe all of it to SFT. The evaluation measures
the policy against its RL start on the pinned set (``golden/rl_gain``, each judge's
``win_rate_vs_rl_start``); the run summary, the version's description and the evaluation
report say the result the same way: the gain with its interval, or plainly that RL added
nothing measurable when the interval does not clear "no change" (0 for a gain, 0.5 for a
win rate, where a tie counts half).
"""

from __future__ import annotations

from collections.abc import Mapping

from alignflow.evaluation.intervals import Estimate, read_estimate
from alignflow.evaluation.metric_names import (
    GOLDEN,
    RL_GAIN,
    RL_START,
    RL_START_IS_REFERENCE,
    RL_START_TASK_ACCURACY,
    TASK_ACCURACY,
    WIN_RATE_PREFIX,
)

NOTHING_MEASURABLE = "RL added nothing measurable over its start"
WIN_RATE_SUFFIX = f"/{WIN_RATE_PREFIX}{RL_START}"


def rl_start_said(metrics: Mapping[str, float | None]) -> str:
    """Which model the RL stage started from, as far as the evaluation knows it."""
    if metrics.get(RL_START_IS_REFERENCE) == 1.0:
        return "its start is the reference model itself"
    return "its start is the SFT model it was trained from"


def measures(metrics: Mapping[str, float | None]) -> list[tuple[str, Estimate, float]]:
    """What says the RL stage's gain: task accuracy minus its start's where answers exist,
    else each judge's win rate against its start; each with the figure meaning "no change"."""
    gain = read_estimate(metrics, RL_GAIN)
    if gain is not None:
        return [("task accuracy gain", gain, 0.0)]
    rates = sorted(k for k in metrics if k.startswith(f"{GOLDEN}/") and k.endswith(WIN_RATE_SUFFIX))
    found = [(k.split("/")[1], read_estimate(metrics, k)) for k in rates]
    return [(f"{judge} win rate", rate, 0.5) for judge, rate in found if rate is not None]


def _shown(name: str, estimate: Estimate, no_change: float) -> str:
    assert estimate.value is not None and estimate.low is not None and estimate.high is not None
    value = f"{estimate.value:+.3f}" if no_change == 0.0 else f"{estimate.value:.3f}"
    return f"{name} {value} [{estimate.low:.3f}, {estimate.high:.3f}] n={estimate.n}"


def rl_gain_line(metrics: Mapping[str, float | None]) -> str | None:
    """The RL stage against its start in one line; None where the evaluation did not measure it."""
    found = measures(metrics)
    if not found:
        return None
    shown = "; ".join(_shown(name, estimate, no_change) for name, estimate, no_change in found)
    accuracy, start = metrics.get(TASK_ACCURACY), metrics.get(RL_START_TASK_ACCURACY)
    if accuracy is not None and start is not None:
        shown += f" (task accuracy {accuracy:.3f} vs its start's {start:.3f})"
    added = any(estimate.low is not None and estimate.low > no_change for _, estimate, no_change in found)
    head = "RL stage over its start" if added else NOTHING_MEASURABLE
    return f"{head}: {shown}; {rl_start_said(metrics)}"
