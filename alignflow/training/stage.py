"""What every training stage shares: config basics, seeding, crash-safe checkpoints, tracking.

A stage (``sft``, ``reward``, ``dpo``, ``grpo``, ``ppo``) is a function
``run_<stage>(config, data_dir, output_dir, ...) -> StageResult``. To write a new one:

1. give its config a :class:`StageConfig` base (the common trainer knobs) and build the
   trainer's arguments with :func:`trainer_arguments`;
2. start with :func:`begin_stage` (seed and output folder);
3. build the trainer class with :class:`StageTrainerMixin` first in its bases, add
   :class:`TrackingCallback` to its callbacks;
4. call :func:`train_with_resume` (it resumes from the last complete checkpoint and
   returns the checkpoint it resumed from), then :func:`save_final_model` and
   :func:`finish_stage`.

Layout of a stage's ``output_dir``: ``checkpoints/checkpoint-N`` (each renamed into place
only once fully written), ``model/`` (the final model, safetensors) and ``result.json``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from alignflow import progress
from alignflow.data.snapshot import load_split
from alignflow.models.factory import mixed_precision_flags
from alignflow.models.model_config import ModelSpec
from alignflow.registry import tracking
from alignflow.training.stage_config import StageConfig

CHECKPOINTS = "checkpoints"
MODEL = "model"
RESULT = "result.json"
STAGING = ".staging"
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


@dataclass
class StageResult:
    """What a stage hands to the next one: where it wrote, what it measured, where it resumed."""

    stage: str
    output_dir: str
    model_dir: str
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: str | None = None

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
    """Seed python, numpy and torch and ask torch for deterministic kernels where it has them."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # deterministic mode also NaN-fills every fresh allocation (a debugging aid for reads of
    # uninitialised memory); it tripled DPO step time on CPU and changes no result
    torch.utils.deterministic.fill_uninitialized_memory = False


def stage_seed(config: StageConfig, pipeline_seed: int) -> int:
    return pipeline_seed if config.seed is None else config.seed


def begin_stage(config: StageConfig, pipeline_seed: int, output_dir: str | Path) -> tuple[int, Path]:
    """Seed everything with the stage's seed and create its output folder; every stage starts here."""
    seed = stage_seed(config, pipeline_seed)
    seed_everything(seed)
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
        **mixed_precision_flags(model),
        # TRL's configs turn checkpointing on by default: say what the stage config says.
        # transformers 5 renamed the flag; the old name serves older releases (the filter
        # drops whichever name a config class does not have).
        "activation_checkpointing": config.gradient_checkpointing,
        "gradient_checkpointing": config.gradient_checkpointing,
    }
    args.update(config.extra_args)
    return {k: v for k, v in args.items() if v is not None or k == "save_total_limit"}


def filter_known_args(config_cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop keys a given config class does not define (transformers versions differ)."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(config_cls)}
    return {k: v for k, v in kwargs.items() if k in known}


# ---------------------------------------------------------------- checkpoints


class StageTrainerMixin:
    """What every stage's trainer adds to its TRL/transformers base class.

    Checkpoints are written into a staging folder, then renamed into place: a crash (even
    SIGKILL) mid-save leaves only a staging folder behind, never a half-written
    ``checkpoint-N``, so every ``checkpoint-N`` that exists is complete. And a run without
    progress bars stays quiet: transformers would print every log dict instead, while the
    metrics already reach the tracker. Put it first in a trainer's bases:
    ``class T(StageTrainerMixin, DPOTrainer)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.args.disable_tqdm:
            from transformers.trainer_callback import PrinterCallback

            self.remove_callback(PrinterCallback)

    def _save_checkpoint(self, model, trial):  # noqa: D401 - transformers' hook
        run_dir = Path(self._get_output_dir(trial=trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = run_dir / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self._get_output_dir = lambda trial=None: str(staging)  # shadows the method for this save only
        try:
            super()._save_checkpoint(model, trial)
        finally:
            del self._get_output_dir
        final = run_dir / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging / name, final)
        _fsync_dir(run_dir)
        shutil.rmtree(staging, ignore_errors=True)
        if self.args.should_save:
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_complete_checkpoint(path: Path) -> bool:
    """A checkpoint is usable when its trainer state and weights are there."""
    has_weights = any(path.glob("*.safetensors"))
    return path.is_dir() and (path / "trainer_state.json").exists() and has_weights


def last_complete_checkpoint(checkpoints_dir: str | Path) -> Path | None:
    """The highest-step complete ``checkpoint-N``; staging leftovers of a crash are removed."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return None
    shutil.rmtree(root / STAGING, ignore_errors=True)
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_RE.match(child.name)
        if match and is_complete_checkpoint(child):
            found.append((int(match.group(1)), child))
    return max(found)[1] if found else None


def train_with_resume(trainer: Any, output_dir: str | Path, resume: bool = True) -> tuple[Any, str | None]:
    """Train, continuing from the last complete checkpoint when there is one."""
    checkpoint = last_complete_checkpoint(Path(output_dir) / CHECKPOINTS) if resume else None
    output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return output, str(checkpoint) if checkpoint else None


# ---------------------------------------------------------------- saving and tracking


def save_final_model(trainer: Any, output_dir: str | Path, merge_lora: bool = True) -> Path:
    """Save the trained model + tokenizer under ``output_dir/model`` (staged, then renamed).

    LoRA adapters are merged into the base weights unless the base is quantized, so the
    next stage and the registry see a plain model; a quantized base keeps its adapter.
    """
    target = Path(output_dir) / MODEL
    staging = Path(output_dir) / ".model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "peft_config") and merge_lora and not getattr(model, "is_loaded_in_4bit", False):
        model = model.merge_and_unload()
    model.save_pretrained(staging, safe_serialization=True)
    processing = getattr(trainer, "processing_class", None)
    if processing is not None:
        processing.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.replace(target)
    return target


def finish_stage(
    stage: str, output_dir: str | Path, model_dir: Path, metrics: Mapping[str, Any], resumed_from: str | None
) -> StageResult:
    """Write ``result.json``, log final metrics and the model to the active MLflow run."""
    clean = {
        k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    result = StageResult(stage, str(output_dir), str(model_dir), clean, resumed_from)
    result.write()
    tracking.log_metrics({f"{stage}/{k}": v for k, v in clean.items()})
    tracking.set_tags({f"{stage}.resumed_from": resumed_from or "none"})
    if tracking.active():
        import mlflow

        mlflow.log_artifacts(str(model_dir), artifact_path=f"{stage}/model")
    return result


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


# ---------------------------------------------------------------- data


def _prompt_key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def pairs_from_scored(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Preference pairs formed per prompt from scored rows: the higher score is chosen.

    Equal scores carry no preference and form no pair; ``margin`` is the score gap.
    """
    by_prompt: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_prompt.setdefault(_prompt_key(record["prompt"]), []).append(record)
    pairs = []
    for rows in by_prompt.values():
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if a["score"] == b["score"]:
                    continue
                hi, lo = (a, b) if a["score"] > b["score"] else (b, a)
                pairs.append(
                    {
                        "id": f"{hi.get('id')}>{lo.get('id')}",
                        "prompt": hi["prompt"],
                        "chosen": hi["completion"],
                        "rejected": lo["completion"],
                        "margin": float(hi["score"] - lo["score"]),
                        "metadata": hi.get("metadata") or {},
                    }
                )
    return pairs


def load_pairs(data_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """A split's preference pairs: ``pair`` rows plus pairs derived from ``scored`` rows."""
    return load_split(data_dir, split, kind="pair") + pairs_from_scored(
        load_split(data_dir, split, kind="scored")
    )


def load_optional_pairs(data_dir: str | Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Like :func:`load_pairs` but an absent split is empty (eval is optional)."""
    try:
        pairs = load_pairs(data_dir, split)
    except FileNotFoundError:
        return []
    return pairs[:limit] if limit else pairs


def require_rows(rows: list, data_dir: str | Path, split: str, what: str) -> list:
    if not rows:
        raise ValueError(f"{data_dir}/{split}.parquet: no {what} rows for this stage")
    return rows


def corpus_texts(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every text field of the records: what the tiny preset trains its tokenizer on."""
    texts = []
    for record in records:
        for key in ("prompt", "chosen", "rejected", "completion"):
            value = record.get(key)
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list):
                texts.extend(m.get("content", "") for m in value)
    return texts


def resolve_start_model(
    spec: ModelSpec, records: list[Mapping[str, Any]], output_dir: str | Path, model_path: str | Path | None
) -> str:
    """The model a stage starts from: the previous stage's output, else the spec's base model."""
    if model_path is not None:
        return str(model_path)
    from alignflow.models.factory import prepare_base_model

    return prepare_base_model(spec, corpus_texts(records), output_dir)
