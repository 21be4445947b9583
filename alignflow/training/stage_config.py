"""The knobs every stage's config shares (kept free of torch imports: configs load fast).

:class:`RunConfig` holds what any stage's run needs (seeding, resuming, logging, saving,
evaluation batch, schedule); :class:`StageConfig` adds the trainer knobs in transformers'
names. A stage whose algorithm names those knobs its own way (PPO: ``num_iterations``,
``batch_size``, ``save_every``) extends its algorithm's config and :class:`RunConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RunConfig(BaseModel):
    """How a stage runs, whatever its algorithm."""

    model_config = ConfigDict(extra="forbid")

    per_device_eval_batch_size: int = Field(32, ge=1)
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    lr_scheduler_type: str = "linear"
    max_length: int = Field(128, ge=8)
    logging_steps: int = Field(10, ge=1)
    save_total_limit: int | None = Field(2, ge=1)
    eval_max_rows: int | None = Field(None, ge=1, description="cap on eval rows (speed)")
    seed: int | None = Field(None, description="None: the pipeline's seed")
    resume: bool = Field(True, description="continue from the last complete checkpoint in output_dir")
    gradient_checkpointing: bool = False
    deterministic: bool | None = Field(
        None,
        description="torch's deterministic kernels. None: on a CPU, where they cost nothing (an "
        "operation without one warns and runs), off on a GPU, where they cost speed; True: on any "
        "device, and an operation without one stops the stage naming it; False: off. The stage "
        "run's compute.deterministic tag says which mode trained",
    )


class StageConfig(RunConfig):
    """Trainer knobs every transformers/TRL-based stage has; each such stage's config extends it."""

    learning_rate: float = Field(1e-3, gt=0)
    max_steps: int = Field(100, ge=1)
    per_device_train_batch_size: int = Field(16, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    save_steps: int = Field(50, ge=1)
    group_by_length: bool = Field(
        False,
        description="batches of rows of similar length, drawn from shuffled mega-batches (transformers' "
        "group_by_length): far less padding on data of mixed lengths; False: plain random batches",
    )

    @property
    def groups_by_length(self) -> bool:
        """Whether this run's batches are length-grouped: the setting, unless the stage's rows
        carry their own labels (a batch of similar lengths could then be a batch of one label)."""
        return self.group_by_length

    torch_compile: bool = Field(
        False,
        description="compile each decoder layer with torch.compile (accelerate's regional compilation, "
        "dynamic shapes): faster steps once compiled, about half a minute of compiling first; "
        "pays on long runs",
    )
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="passed through to the TRL/transformers config (any field it has)"
    )


class HeldOutSchedule(BaseModel):
    """How an RL stage watches its held-out set while it trains, and which step it hands on
    (:class:`~alignflow.training.held_out_best.HeldOutCurve`)."""

    eval_every: int = Field(
        0,
        ge=0,
        description="score the held-out set by the stage's own measure every this many steps (logged "
        "beside the training figures, drawn in the learning curves); 0: only before and after training",
    )
    hand_on: Literal["best", "last"] = Field(
        "best",
        description="with eval_every: the policy of the step that scored best there (0: the start, when "
        "none beat it), or the last step's; the stage says which (handed_on_step)",
    )
