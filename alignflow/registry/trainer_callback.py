"""A trainer's logs into the active MLflow run and its steps into the live progress view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from alignflow import progress
from alignflow.registry import tracking


class TrackingCallback(TrainerCallback):
    """Send a trainer's logs to the active MLflow run as ``train/...`` and ``eval/...`` metrics,
    and its steps to :mod:`alignflow.progress` (step n of max_steps, for a live view)."""

    def __init__(self, params: Mapping[str, Any] | None = None, prefix: str = ""):
        self.params = dict(params or {})
        self.prefix = prefix

    def on_train_begin(self, args, state, control, **kwargs):
        if self.params and state.global_step == 0:
            tracking.log_params(self.params)
        if state.global_step:
            progress.note(f"resumed at step {state.global_step}")
        progress.step(state.global_step, state.max_steps or None)

    def on_step_end(self, args, state, control, **kwargs):
        progress.step(state.global_step, state.max_steps or None)

    def on_log(self, args, state, control, logs=None, **kwargs):
        tracking.log_metrics(metric_names(logs or {}, self.prefix), step=state.global_step)


def metric_names(logs: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``loss`` -> ``train/loss``, ``eval_loss`` -> ``eval/loss``, ``rewards/accuracies`` kept scoped."""
    named = {}
    for key, value in logs.items():
        if key.startswith("eval_"):
            name = "eval/" + key[len("eval_") :]
        elif key.startswith(("train/", "eval/")):
            name = key
        elif key.startswith("train_"):
            name = "train/" + key[len("train_") :]
        else:
            name = "train/" + key
        named[prefix + name] = value
    return named
