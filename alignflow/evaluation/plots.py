"""The report's figures, drawn with matplotlib's non-interactive Agg backend.

Each function writes one PNG and returns its path, so a flow can log them as artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from alignflow.evaluation.metric_names import EVAL, HANDED_ON_STEP, is_win_rate, stage_figure  # noqa: E402
from alignflow.evaluation.report import EvalReport  # noqa: E402


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_distributions(
    series: Mapping[str, Sequence[float]], path: str | Path, title: str, xlabel: str
) -> Path:
    """Overlaid histograms, one per named series (chosen vs rejected rewards, lengths)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in series.items():
        if values:
            ax.hist(list(values), bins=30, alpha=0.5, label=f"{label} (n={len(values)})")
    ax.set(title=title, xlabel=xlabel, ylabel="count")
    ax.legend()
    return _save(fig, path)


@dataclass(frozen=True)
class WinRateBar:
    """One bar of the win-rate plot: the rate and, where one was measured, its 95% interval."""

    label: str
    rate: float
    low: float | None = None
    high: float | None = None

    def error(self) -> tuple[float, float]:
        """Distances from the rate down to the lower and up to the upper bound (0 without one)."""
        low = self.rate if self.low is None else self.low
        high = self.rate if self.high is None else self.high
        return max(self.rate - low, 0.0), max(high - self.rate, 0.0)


def win_rate_bars(metrics: Mapping[str, float | None]) -> list[WinRateBar]:
    """The win rates among ``metrics``, each with the interval stored beside it: the ``/low``,
    ``/high`` and ``/n`` keys are that interval and its row count, not rates of their own."""
    bars = []
    for key, rate in metrics.items():
        if is_win_rate(key) and rate is not None:
            low, high = metrics.get(f"{key}/low"), metrics.get(f"{key}/high")
            bars.append(WinRateBar(key.removeprefix(f"{EVAL}/"), rate, low, high))
    return bars


def plot_win_rates(bars: Sequence[WinRateBar], path: str | Path) -> Path:
    """Horizontal bars of win rates, error bars spanning their 95% intervals, and the 0.5 line
    (no better than the opponent)."""
    fig, ax = plt.subplots(figsize=(6, 0.5 * max(len(bars), 2) + 1))
    errors = [bar.error() for bar in bars]
    ax.barh(
        [bar.label for bar in bars],
        [bar.rate for bar in bars],
        xerr=[[e[0] for e in errors], [e[1] for e in errors]],
        color="tab:blue",
        capsize=3,
    )
    ax.axvline(0.5, color="grey", linestyle="--")
    ax.set(xlim=(0, 1), title="Win rates (95% intervals)", xlabel="share of prompts won (ties count half)")
    return _save(fig, path)


# what a learning curve shows of a trainer's logs, in order: the objective, the reward it
# climbs (GRPO/PPO), the preference accuracy and margin (DPO, reward models), held-out loss
CURVE_KEYS = (
    "train/loss",
    "train/reward",
    "train/reward/mean",
    "eval/reward",
    "train/rewards/accuracies",
    "train/rewards/margins",
    "train/accuracy",
    "train/kl",
    "eval/loss",
    "eval/accuracy",
)


def _history(client, run_id: str, key: str) -> tuple[list[int], list[float]]:
    """A metric's values by step, the first logged at each step: a trainer's end-of-run
    summary (TRL's ``train_loss``, the mean over the run) lands on its last step's key too."""
    first: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        first.setdefault(m.step, m.value)
    return list(first), list(first.values())


def learning_curves(tracking_uri: str, run_ids: Mapping[str, str]) -> list[tuple[str, str, list, list]]:
    """(stage, metric, steps, values) of each stage run's :data:`CURVE_KEYS` that it logged at
    two steps or more (a single point is not a curve)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    curves = []
    for stage, run_id in run_ids.items():
        logged = client.get_run(run_id).data.metrics
        for key in (k for k in CURVE_KEYS if k in logged):
            steps, values = _history(client, run_id, key)
            if len(steps) >= 2:
                curves.append((stage, key, steps, values))
    return curves


def handed_on_steps(tracking_uri: str, run_ids: Mapping[str, str]) -> dict[str, int]:
    """Per stage run that says so (``handed_on_step``), the step whose model it handed on."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    found = {
        stage: stage_figure(client.get_run(run_id).data.metrics, HANDED_ON_STEP)
        for stage, run_id in run_ids.items()
    }
    return {stage: int(step) for stage, step in found.items() if step is not None}


def plot_learning_curves(tracking_uri: str, run_ids: Mapping[str, str], path: str | Path) -> Path | None:
    """One panel per stage and metric (loss, reward, accuracy ... against the trainer's step),
    read back from MLflow's history of each stage run; None when no stage logged a curve."""
    curves = learning_curves(tracking_uri, run_ids)
    if not curves:
        return None
    columns = min(len(curves), 2)
    rows = -(-len(curves) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 2.6 * rows), squeeze=False)
    handed_on = handed_on_steps(tracking_uri, run_ids)
    for ax, (stage, key, steps, values) in zip(axes.flat, curves, strict=False):
        ax.plot(steps, values, marker="." if len(steps) < 30 else None)
        ax.set(title=f"{stage}: {key}", xlabel="step")
        if stage in handed_on:  # the step whose held-out score the stage handed on
            ax.axvline(
                handed_on[stage], color="tab:green", linestyle="--", label=f"handed on: {handed_on[stage]}"
            )
            ax.legend(loc="best", fontsize="small")
    for ax in list(axes.flat)[len(curves) :]:
        ax.set_visible(False)
    return _save(fig, path)


def report_plots(report: EvalReport, out_dir: str | Path) -> dict[str, Path]:
    """The standard figures of an eval report (those its data allows)."""
    out_dir = Path(out_dir)
    s, plots = report.series, {}
    if s.get("reward/chosen"):
        plots["reward_distributions"] = plot_distributions(
            {"chosen": s["reward/chosen"], "rejected": s.get("reward/rejected", [])},
            out_dir / "reward_distributions.png",
            "Reward on held-out pairs",
            "reward",
        )
    if s.get("length/policy"):
        plots["response_lengths"] = plot_distributions(
            {"policy": s["length/policy"], "reference": s.get("length/reference", [])},
            out_dir / "response_lengths.png",
            "Response lengths",
            "tokens",
        )
    bars = win_rate_bars(report.metrics)
    if bars:
        plots["win_rates"] = plot_win_rates(bars, out_dir / "win_rates.png")
    return plots
