"""Crash-safe checkpoints of a stage's trainer: staged then renamed, resumed from the last complete one.

Layout of a stage's ``output_dir``: ``checkpoints/checkpoint-N`` (each renamed into place
only once fully written) and ``model/`` (the final model, safetensors).
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from alignflow.errors import InputError
from alignflow.models.cpu_attention import use_cpu_attention
from alignflow.models.fp32_gemm import use_onednn_linears
from alignflow.models.fused_norm import use_fused_rms_norms
from alignflow.models.loading import first_few, non_finite_tensors
from alignflow.models.lora_precision import compute_adapters_in_base_dtype
from alignflow.rl.checkpoint_files import STAGING, move_into_place
from alignflow.training.compilation import (
    compile_layer_by_layer,
    compiled_modules,
    follow_mode,
    require_cpu_compiler,
)
from alignflow.training.model_preparation import PreparedModelsMixin

CHECKPOINTS = "checkpoints"
MODEL = "model"
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")

if TYPE_CHECKING:  # the mixin is mixed into a transformers Trainer: its attributes and hooks
    from transformers import Trainer as _TrainerBase
else:
    _TrainerBase = object


class TrainingDiverged(InputError):
    """The training loss or the trained weights went NaN or infinite: the run must not hand on a model."""


class StageTrainerMixin(PreparedModelsMixin, _TrainerBase):
    """What every stage's trainer adds to its TRL/transformers base class.

    Checkpoints are written into a staging folder, then renamed into place: a crash (even
    SIGKILL) mid-save leaves only a staging folder behind, never a half-written
    ``checkpoint-N``, so every ``checkpoint-N`` that exists is complete. And a run without
    progress bars stays quiet: transformers would print every log dict instead, while the
    metrics already reach the tracker. Put it first in a trainer's bases:
    ``class T(StageTrainerMixin, DPOTrainer)``.
    """

    half_precision_adapters: int = 0  # LoRA layers computing in their bf16/fp16 base's dtype
    cpu_attention: bool = False  # attention as plain matmuls on a CPU (alignflow.models.cpu_attention)
    onednn_linears: int = 0  # fp32 Linear layers whose products run on oneDNN (alignflow.models.fp32_gemm)
    fused_norms: int = 0  # RMSNorm layers computed by one fused kernel on a CPU (alignflow.models.fused_norm)

    _fast_paths_on: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.args.torch_compile:
            require_cpu_compiler(self.args.use_cpu)
        if self.args.disable_tqdm:
            from transformers.trainer_callback import PrinterCallback

            self.remove_callback(PrinterCallback)

    def prepare_models(self) -> None:
        """Switch the policy (and a separate reference) to alignflow's faster CPU paths, once."""
        super().prepare_models()
        if self._fast_paths_on:
            return
        self._fast_paths_on = True
        self.half_precision_adapters = compute_adapters_in_base_dtype(self.model)
        self.cpu_attention = use_cpu_attention(self.model)
        self.onednn_linears = use_onednn_linears(self.model)
        self.fused_norms = use_fused_rms_norms(self.model)
        reference = getattr(self, "ref_model", None)
        if reference is not None:
            use_cpu_attention(reference)
            use_onednn_linears(reference)
            use_fused_rms_norms(reference)

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        """transformers' Accelerator arguments, with ``torch_compile`` compiling layer by layer
        (:mod:`alignflow.training.compilation`)."""
        return compile_layer_by_layer(super()._build_accelerator_args(**kwargs))

    def training_step(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """A training step, with the trainer's own model in train mode too (a compiled copy's
        mode does not reach it: :func:`~alignflow.training.compilation.follow_mode`)."""
        follow_mode(self.model, training=True)
        return super().training_step(model, *args, **kwargs)

    def prediction_step(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """An evaluation step, with the trainer's own model in eval mode too."""
        follow_mode(self.model, training=False)
        return super().prediction_step(model, *args, **kwargs)

    def compute_paths(self) -> dict[str, str]:
        """Which of alignflow's faster paths this trainer's run took, as stage-run tags: two runs
        that differ in speed can be told apart in the MLflow UI."""
        calls = int(getattr(self, "label_head_calls", 0))
        packing = getattr(self, "packing", None)
        return {
            "compute.label_head": f"on ({calls} forwards)" if calls else "off",
            "compute.packed_rows": packing.describe() if packing is not None else "off",
            "compute.half_precision_adapters": str(self.half_precision_adapters),
            "compute.attention": "cpu matmuls" if self.cpu_attention else "as loaded",
            "compute.fp32_products": (
                f"oneDNN ({self.onednn_linears} layers)" if self.onednn_linears else "torch"
            ),
            "compute.fused_norms": str(self.fused_norms),
            "compute.compiled_modules": str(compiled_modules(self.model_wrapped)),
        }

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Log, then stop on a non-finite training loss: later steps only spread the NaN, and
        transformers' own filter would have logged an average of earlier losses instead."""
        super().log(logs, *args, **kwargs)
        loss = logs.get("loss")
        if loss is not None and not math.isfinite(loss):
            raise TrainingDiverged(
                f"training loss is {loss} at step {self.state.global_step} (learning rate "
                f"{logs.get('learning_rate', self.args.learning_rate)}): the run diverged; "
                "lower the learning rate or check the data"
            )

    _saving_into: Path | None = None  # the staging folder while a checkpoint is being written

    def _get_output_dir(self, trial: Any) -> str:
        """Where transformers writes a checkpoint: the staging folder while one is being saved."""
        return str(self._saving_into) if self._saving_into is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):  # noqa: D401 - transformers' hook
        run_dir = Path(self._get_output_dir(trial=trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = run_dir / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self._saving_into = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._saving_into = None
        keep = self.args.save_total_limit if self.args.should_save else None
        move_into_place(staging / name, run_dir / name, keep)
        shutil.rmtree(staging, ignore_errors=True)


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


def refuse_diverged_weights(model: Any, step: int, target: Path) -> None:
    """Raise :class:`TrainingDiverged` rather than save NaN or infinite weights to ``target``:
    the next stage, the evaluation and the registry would all refuse them later."""
    broken = non_finite_tensors(model)
    if broken:
        raise TrainingDiverged(
            f"the model trained at step {step}: NaN or infinite weights in {len(broken)} tensors "
            f"({first_few(broken)}): not saved to {target}"
        )


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
    refuse_diverged_weights(model, trainer.state.global_step, target)
    model.save_pretrained(staging, safe_serialization=True)
    processing = getattr(trainer, "processing_class", None)
    if processing is not None:
        processing.save_pretrained(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.replace(target)
    return target
