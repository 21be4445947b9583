"""One evaluation report per run: flat metrics, sample completions and the raw series
behind the plots, written as JSON (for machines, the promotion gates) and Markdown (for
people, the MLflow UI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from alignflow.evaluation.intervals import is_bound_key
from alignflow.evaluation.metric_names import GOLDEN
from alignflow.evaluation.rl_stage import rl_gain_line


class EvalReport(BaseModel):
    """Everything one evaluation produced; ``metrics`` keys are what the gates read."""

    metrics: dict[str, float | None] = Field(default_factory=dict)
    samples: list[dict[str, Any]] = Field(default_factory=list)
    series: dict[str, list[float]] = Field(default_factory=dict, description="scores/lengths for plots")
    info: dict[str, Any] = Field(default_factory=dict)

    def gate_metrics(self) -> dict[str, float]:
        """The measured metrics only (a metric that could not be computed is left out)."""
        return {k: float(v) for k, v in self.metrics.items() if v is not None}

    def merge(self, other: EvalReport) -> EvalReport:
        """Reward-model and policy evaluations of one run combined into the run's report."""
        return EvalReport(
            metrics={**self.metrics, **other.metrics},
            samples=self.samples + other.samples,
            series={**self.series, **other.series},
            info={**self.info, **other.info},
        )


def _cell(value: Any) -> str:
    text = "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", "⏎")


def _side_by_side(metrics: dict[str, float | None]) -> list[str]:
    """Pinned-set figures (with their intervals) beside the same figure on this run's eval split."""
    names = sorted(
        k.removeprefix(f"{GOLDEN}/") for k in metrics if k.startswith(f"{GOLDEN}/") and not is_bound_key(k)
    )
    if not names:
        return []
    lines = ["## Pinned set vs this data version's eval split", ""]
    lines += ["| metric | pinned set | 95% interval | n | eval split |", "|---|---|---|---|---|"]
    for name in names:
        low, high, n = (metrics.get(f"golden/{name}/{s}") for s in ("low", "high", "n"))
        interval = f"[{_cell(low)}, {_cell(high)}]" if low is not None else ""
        count = str(int(n)) if n is not None else ""
        lines.append(
            f"| `{name}` | {_cell(metrics[f'golden/{name}'])} | {interval} | {count} | "
            f"{_cell(metrics.get(f'eval/{name}'))} |"
        )
    return [*lines, ""]


def to_markdown(report: EvalReport, title: str = "Evaluation report") -> str:
    lines = [f"# {title}", ""]
    if report.info:
        lines += [*(f"- **{k}**: {_cell(v)}" for k, v in sorted(report.info.items())), ""]
    rl_stage = rl_gain_line(report.metrics)
    lines += ["## What the RL stage added", "", rl_stage, ""] if rl_stage else []
    lines += _side_by_side(report.metrics)
    lines += ["## Metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| `{k}` | {_cell(v)} |" for k, v in sorted(report.metrics.items())]
    if report.samples:
        columns = list(report.samples[0])
        lines += ["", "## Completions", "", "| " + " | ".join(columns) + " |"]
        lines += ["|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in report.samples]
    return "\n".join(lines) + "\n"


def write_report(report: EvalReport, out_dir: str | Path) -> dict[str, Path]:
    """``eval_report.json`` and ``eval_report.md`` under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "eval_report.json", "markdown": out_dir / "eval_report.md"}
    paths["json"].write_text(
        json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True), encoding="utf-8"
    )
    paths["markdown"].write_text(to_markdown(report), encoding="utf-8")
    return paths


def read_report(path: str | Path) -> EvalReport:
    return EvalReport.model_validate_json(Path(path).read_text(encoding="utf-8"))


def samples_table(report: EvalReport) -> dict[str, list[Any]]:
    """The completions as columns, the shape ``mlflow.log_table(data=...)`` takes."""
    columns = list(report.samples[0]) if report.samples else []
    return {c: [row.get(c) for row in report.samples] for c in columns}
