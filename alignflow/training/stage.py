"""The life of a training stage: seed, trainer arguments, result, and the model it starts from.

A stage is a function ``run_<name>(config, data_dir, output_dir, model_path=None) ->
StageResult`` registered in :mod:`alignflow.training.registry`. To write a new one:

1. give its config a :class:`~alignflow.training.stage_config.StageConfig` base (the common
   trainer knobs) and build the trainer's arguments with :func:`trainer_arguments`;
2. start with :func:`begin_stage` (seed and output folder);
3. build the trainer class with :class:`~alignflow.training.checkpoints.StageTrainerMixin`
   first in its bases, add :class:`~alignflow.registry.trainer_callback.TrackingCallback` to its
   callbacks;
4. end with :func:`train_and_finish`: held-out figures before and after, training resumed
   from the last complete checkpoint, the model saved and ``result.json`` written (a stage
   with its own loop, like PPO, calls :func:`finish_stage` itself).

``output_dir`` holds ``checkpoints/``, ``model/`` and ``result.json``.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alignflow import progress
from alignflow.data.pairing import corpus_texts
from alignflow.errors import InputError
from alignflow.evaluation.cost import training_cost
from alignflow.evaluation.metric_names import EVAL, before_key, eval_key
from alignflow.models.cpu_heap import retain_freed_memory
from alignflow.models.factory import mixed_precision_flags
from alignflow.models.model_config import ModelSpec
from alignflow.models.positions import position_limit
from alignflow.registry import tracking
from alignflow.training.checkpoints import CHECKPOINTS, save_final_model, train_with_resume
from alignflow.training.determinism import DETERMINISM_TAG, resume_caveat, use_determinism
from alignflow.training.held_out_best import HeldOutCurve
from alignflow.training.stage_config import RunConfig, StageConfig

logger = logging.getLogger(__name__)

RESULT = "result.json"


@dataclass
class StageResult:
    """What a stage hands to the next one: where it wrote, what it measured, where it resumed."""

    stage: str
    output_dir: str
    model_dir: str
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: str | None = None
    cost: dict[str, float] = field(default_factory=dict)  # what its training ran: cost/tokens_trained...

    def write(self) -> Path:
        path = Path(self.output_dir) / RESULT
        _atomic_write_text(path, json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, output_dir: str | Path) -> StageResult:
        return cls(**json.loads((Path(output_dir) / RESULT).read_text(encoding="utf-8")))


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def stage_seed(config: RunConfig, pipeline_seed: int) -> int:
    return pipeline_seed if config.seed is None else config.seed


def begin_stage(config: RunConfig, pipeline_seed: int, output_dir: str | Path) -> tuple[int, Path]:
    """Seed everything with the stage's seed, set its deterministic kernels (tagged) and create
    its output folder; every stage starts here."""
    seed = stage_seed(config, pipeline_seed)
    seed_everything(seed)
    tracking.set_tags({DETERMINISM_TAG: use_determinism(config.deterministic)})
    retain_freed_memory()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    return seed, output_dir


def trainer_arguments(
    config: StageConfig, output_dir: str | Path, model: ModelSpec, seed: int, has_eval: bool
) -> dict[str, Any]:
    """Keyword arguments shared by every TRL/transformers config class."""
    args: dict[str, Any] = {
        "output_dir": str(Path(output_dir) / CHECKPOINTS),
        "learning_rate": config.learning_rate,
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "per_device_eval_batch_size": config.per_device_eval_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "warmup_ratio": config.warmup_ratio,
        "weight_decay": config.weight_decay,
        "lr_scheduler_type": config.lr_scheduler_type,
        "logging_steps": config.logging_steps,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": config.save_total_limit,
        "eval_strategy": "no",
        "seed": seed,
        "data_seed": seed,
        "report_to": [],  # tracking goes through TrackingCallback into the caller's active run
        # progress bars follow transformers' verbosity (TRANSFORMERS_VERBOSITY=error hides them);
        # none while somebody shows our own progress (alignflow.progress: the CLI's live view)
        "disable_tqdm": True if progress.active() else None,
        "dataloader_num_workers": 0,
        "use_cpu": not torch.cuda.is_available(),
        "save_safetensors": True,
        "logging_nan_inf_filter": False,  # a NaN loss is logged as NaN (the mixin then stops the run)
        "train_sampling_strategy": "group_by_length" if getattr(config, "groups_by_length", False) else None,
        **mixed_precision_flags(model),
        # TRL's configs turn checkpointing on by default: say what the stage config says.
        # transformers 5 renamed the flag; the old name serves older releases (the filter
        # drops whichever name a config class does not have).
        "activation_checkpointing": config.gradient_checkpointing,
        "gradient_checkpointing": config.gradient_checkpointing,
        "torch_compile": config.torch_compile or None,  # off: transformers' default (its env settings)
    }
    args.update(config.extra_args)
    return {k: v for k, v in args.items() if v is not None or k == "save_total_limit"}


def require_length_fits(model: Any, tokenizer: Any, length: int | None, key: str, source: Any) -> None:
    """Refuse a stage's ``length`` beyond the model's table of absolute positions (BERT, GPT-2,
    OPT) before any step: the first long row would index past the table mid-run."""
    limit = position_limit(model, tokenizer)
    if limit is not None and length is not None and length > limit:
        raise InputError(f"{key} {length} exceeds the {limit} positions of {source}")


def filter_known_args(config_cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop keys a given config class does not define (transformers versions differ)."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(config_cls)}
    return {k: v for k, v in kwargs.items() if k in known}


def held_out_metrics(evaluated: Mapping[str, Any]) -> dict[str, float]:
    """A trainer's ``evaluate()`` figures in the one held-out spelling, numbers only:
    ``eval_loss`` -> ``eval/loss``."""
    return {
        eval_key(key.removeprefix("eval_")): float(value)
        for key, value in evaluated.items()
        if key.startswith("eval_") and isinstance(value, int | float) and not isinstance(value, bool)
    }


def as_before(held_out: Mapping[str, float]) -> dict[str, float]:
    """``eval/<name>`` figures measured before training, as ``eval/before_<name>``."""
    return {before_key(key.removeprefix(f"{EVAL}/")): value for key, value in held_out.items()}


def train_and_finish(
    name: str,
    trainer: Any,
    output_dir: Path,
    resume: bool,
    metrics: Mapping[str, float] | None = None,
    held_out: Callable[[], dict[str, float]] | None = None,
    curve: HeldOutCurve | None = None,
) -> StageResult:
    """The end every trainer-based stage shares: its held-out figures before (``eval/before_*``)
    and after (``eval/*``) training, training resumed from the last complete checkpoint, what
    ran (``train_loss``, ``global_step`` from the trainer's state) and what it cost, the model
    saved and the result written. ``held_out`` measures them (default: the trainer's
    ``evaluate()`` on its eval set, when it has one). With ``curve`` (a callback of the
    trainer's), the step it hands on replaces the last before the model is measured and saved."""

    def evaluated() -> dict[str, float]:
        return held_out_metrics(trainer.evaluate()) if trainer.eval_dataset is not None else {}

    measure = held_out or evaluated
    figures = {**(metrics or {}), **as_before(measure())}
    output, resumed_from = train_with_resume(trainer, output_dir, resume)
    figures["train_loss"] = output.training_loss
    figures["global_step"] = float(trainer.state.global_step)  # what ran, resumes included
    if curve is not None:
        figures["handed_on_step"] = float(curve.hand_on(trainer.state.global_step))
    figures.update(measure())
    model_dir = save_final_model(trainer, output_dir)
    return finish_stage(name, output_dir, model_dir, figures, resumed_from, trained_cost(trainer, output))


def trained_cost(trainer: Any, output: Any) -> dict[str, float]:
    """What the trainer's ``train()`` ran (:func:`~alignflow.evaluation.cost.training_cost`),
    its MFU over the seconds that call took; its device's name and the faster paths it took
    tagged on the active run."""
    figures, tags = training_cost(trainer, float(output.metrics.get("train_runtime", 0.0)))
    paths = getattr(trainer, "compute_paths", None)
    tracking.set_tags({**tags, **(paths() if paths else {})})
    return figures


def finish_stage(
    stage: str,
    output_dir: str | Path,
    model_dir: Path,
    metrics: Mapping[str, Any],
    resumed_from: str | None,
    cost: Mapping[str, float] | None = None,
) -> StageResult:
    """Write ``result.json``, log final metrics, ``cost`` (as it is named) and the model to the
    active MLflow run."""
    clean = {
        k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    result = StageResult(stage, str(output_dir), str(model_dir), clean, resumed_from, dict(cost or {}))
    result.write()
    tracking.log_metrics({f"{stage}/{k}": v for k, v in clean.items()})
    tracking.log_metrics(result.cost)
    tracking.set_tags({f"{stage}.resumed_from": resumed_from or "none"})
    if resumed_from:
        say_how_exact_the_resume_was(stage, resumed_from)
    if tracking.active():
        import mlflow

        mlflow.log_artifacts(str(model_dir), artifact_path=f"{stage}/model")
    return result


def say_how_exact_the_resume_was(stage: str, resumed_from: str) -> None:
    """Tag ``<stage>.resume_exact`` (``yes``, or ``no: why``) and warn where a resumed stage
    cannot promise an uninterrupted run's weights."""
    caveat = resume_caveat()
    tracking.set_tags({f"{stage}.resume_exact": f"no: {caveat}" if caveat else "yes"})
    if caveat:
        logger.warning("%s resumed from %s, not bit for bit: %s", stage, Path(resumed_from).name, caveat)


def resolve_start_model(
    spec: ModelSpec,
    records: Sequence[Mapping[str, Any]],
    output_dir: str | Path,
    model_path: str | Path | None,
) -> str:
    """The model a stage starts from: the previous stage's output, else the spec's base model."""
    if model_path is not None:
        return str(model_path)
    from alignflow.models.factory import prepare_base_model

    return prepare_base_model(spec, corpus_texts(records), output_dir)
