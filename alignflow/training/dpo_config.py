"""Typed configuration of the direct preference optimisation stage (DPO, IPO, ORPO, KTO...)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from alignflow.losses.dpo_loss_types import DPO_LOSS_TYPES
from alignflow.training.stage_config import StageConfig


class DPOConfig(StageConfig):
    """Offline preference optimisation of the SFT policy against a frozen reference."""

    learning_rate: float = Field(5e-4, gt=0)
    method: Literal["dpo", "orpo", "kto"] = Field("dpo", description="which TRL trainer runs")
    loss_type: str | list[str] = Field("sigmoid", description=f"DPO losses: {', '.join(DPO_LOSS_TYPES)}")
    loss_weights: list[float] | None = Field(
        None, description="one weight per loss_type entry (e.g. [1.0, 0.2] for [sigmoid, sft]); None: all 1"
    )
    beta: float = Field(0.1, gt=0)
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    reference_free: bool = Field(False, description="compare against a uniform reference (log p_ref = 0)")
    desirable_weight: float = Field(1.0, gt=0, description="KTO only")
    undesirable_weight: float = Field(1.0, gt=0, description="KTO only")
    max_prompt_length: int | None = None
    group_by_length: bool = Field(
        True,
        description="DPO/ORPO: pairs in batches of similar length (see StageConfig); on preference data "
        "of mixed lengths most of a random batch is padding. KTO's unpaired rows keep random batches",
    )
    precompute_reference: bool = Field(
        True,
        description="method 'dpo': compute the reference's log-probs once before training (cached per "
        "reference weights and tokenized pairs) instead of running the reference at every step",
    )
    reference_cache_dir: str | None = Field(
        None, description="where cached reference log-probs live; None: $ALIGNFLOW_CACHE/reference-logps"
    )

    @property
    def groups_by_length(self) -> bool:
        return self.group_by_length and self.method != "kto"  # KTO: unpaired, labelled rows

    @model_validator(mode="after")
    def _known_losses(self) -> DPOConfig:
        losses = [self.loss_type] if isinstance(self.loss_type, str) else self.loss_type
        unknown = [name for name in losses if name not in DPO_LOSS_TYPES]
        if unknown:
            raise ValueError(f"dpo.loss_type: unknown {unknown}; choose from {list(DPO_LOSS_TYPES)}")
        if self.loss_weights is not None and len(self.loss_weights) != len(losses):
            raise ValueError(
                f"dpo.loss_weights: {len(self.loss_weights)} weight(s) for {len(losses)} loss(es) {losses}; "
                "give one weight per loss_type entry"
            )
        if self.reference_free and self.method != "dpo":
            raise ValueError("dpo.reference_free applies to method 'dpo' only (ORPO needs no reference)")
        return self
