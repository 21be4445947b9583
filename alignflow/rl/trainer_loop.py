"""The research trainers' loop is transformers' ``Trainer``, the loop every pipeline stage runs.

:class:`~alignflow.rl.dpo.DPOTrainer` and :class:`~alignflow.rl.reward_model.RewardModelTrainer`
keep the spec's faces (config dataclasses, ``train`` returning plain dicts) and hand the
optimisation itself to a ``Trainer``: AdamW, warmup schedule, gradient accumulation and
clipping and checkpoints are the library's, not a second hand-written loop. Logs go to the
``callbacks`` a caller hands the face (transformers' ``TrainerCallback``s; the pipeline's
:class:`~alignflow.registry.trainer_callback.TrackingCallback` sends them to MLflow): the
research API itself imports no tracking store. This module turns a face's settings into
``TrainingArguments`` fields and the trainer's log into the history the faces return.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

SUMMARY_KEYS = ("train_runtime", "train_loss", "total_flos")


def loop_arguments(
    *,
    device: torch.device,
    batch_size: int,
    gradient_accumulation_steps: int,
    learning_rate: float,
    max_grad_norm: float,
    seed: int,
    num_epochs: int,
) -> dict[str, Any]:
    """The ``TrainingArguments`` fields every research trainer sets the same way."""
    return {
        "per_device_train_batch_size": batch_size,
        "per_device_eval_batch_size": batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "learning_rate": learning_rate,
        "max_grad_norm": max_grad_norm,
        "num_train_epochs": num_epochs,
        "seed": seed,
        "data_seed": seed,
        "use_cpu": device.type == "cpu",
        "logging_steps": 1,
        "report_to": "none",
        "save_only_model": True,
        "disable_tqdm": True,
    }


def optimizer_steps(examples: int, batch_size: int, accumulation: int, epochs: int) -> int:
    """How many optimiser steps ``Trainer`` takes: a partial accumulation round still steps."""
    return max(1, math.ceil(math.ceil(examples / batch_size) / accumulation) * epochs)


@contextmanager
def output_folder(path: str | None) -> Iterator[str]:
    """``path`` when the user asked for checkpoints there, else a folder that goes away afterwards."""
    if path:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="alignflow-rl-") as scratch:
        yield scratch


def history_from_log(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One record per optimiser step: its train log, plus ``eval/<name>`` where the loop evaluated."""
    by_step: dict[int, dict[str, float]] = {}
    for entry in log_history:
        if any(key in entry for key in SUMMARY_KEYS):
            continue
        step = int(entry["step"])
        record = by_step.setdefault(step, {"step": step})
        for key, value in entry.items():
            if key == "step":
                continue
            record["eval/" + key[len("eval_") :] if key.startswith("eval_") else key] = value
    return [by_step[step] for step in sorted(by_step)]


def last_train_log(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The metrics of the last optimiser step the loop logged (loss, rewards, epoch, ...)."""
    for entry in reversed(log_history):
        if "loss" in entry and not any(key in entry for key in SUMMARY_KEYS):
            return {k: v for k, v in entry.items() if k != "step"}
    return {}


def without_eval_prefix(metrics: dict[str, Any]) -> dict[str, float]:
    """``Trainer.evaluate``'s ``eval_loss`` -> ``loss``; its runtime figures left out."""
    return {
        key[len("eval_") :]: float(value)
        for key, value in metrics.items()
        if key.startswith("eval_") and not key.endswith(("_runtime", "_per_second"))
    }
