"""Safe logging to the active MLflow run, for library code that may run without one.

Library stages call these unconditionally: with no active run they do nothing, so a
notebook user is never forced to set up tracking. Names and values are made to fit
MLflow's limits instead of failing a long training run at its last step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

MAX_PARAM_VALUE = MAX_PARAM_VAL_LENGTH  # MLflow's limit on a param value's length
TRUNCATED = "...[truncated]"  # ends a param value cut to MLflow's limit
MAX_KEY = 250
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


def sanitize_name(name: str) -> str:
    """A metric/param key MLflow accepts: safe characters only, bounded length."""
    cleaned = _UNSAFE.sub("_", str(name)).strip("/") or "_"
    return cleaned[:MAX_KEY]


def active() -> bool:
    return mlflow.active_run() is not None


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys (``sft.learning_rate``)."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def param_value(value: Any) -> str:
    """``value`` as MLflow stores a param: cut to its length limit, the cut marked so that a
    reader of the UI does not take a truncated value for the whole one."""
    text = str(value)
    if len(text) <= MAX_PARAM_VALUE:
        return text
    return text[: MAX_PARAM_VALUE - len(TRUNCATED)] + TRUNCATED


def log_params(params: Mapping[str, Any], prefix: str = "") -> None:
    """Log (flattened, truncated) params to the active run; a no-op without one."""
    if not active():
        return
    safe = {sanitize_name(k): param_value(v) for k, v in flatten(params, prefix).items()}
    mlflow.log_params(safe)


def log_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Log the finite numeric metrics to the active run; a no-op without one."""
    if not active():
        return
    numeric = {
        sanitize_name(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    if numeric:
        mlflow.log_metrics(numeric, step=step)


def set_tags(tags: Mapping[str, Any]) -> None:
    if active():
        mlflow.set_tags({sanitize_name(k): str(v)[:MAX_PARAM_VALUE] for k, v in tags.items()})


def log_report(report: Any, out_dir: str | Path, plots: dict[str, Path] | None = None) -> dict[str, Path]:
    """Write an :class:`~alignflow.evaluation.report.EvalReport` and log it (metrics, files,
    plots, sample table) to the active run.

    Without an active MLflow run only the files are written.
    """
    from alignflow.evaluation.report import samples_table, write_report

    paths = write_report(report, out_dir)
    log_metrics(report.gate_metrics())
    if mlflow.active_run() is not None:
        for path in paths.values():
            mlflow.log_artifact(str(path), "eval")
        for path in (plots or {}).values():
            mlflow.log_artifact(str(path), "plots")
        if report.samples:
            mlflow.log_table(data=samples_table(report), artifact_file="eval/samples.json")
    return paths
