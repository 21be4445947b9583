"""Typed configuration of the direct preference optimisation stage: DPO and its loss family."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from alignflow.losses.dpo_loss_types import DPO_LOSS_TYPES
from alignflow.training.stage_config import HeldOutSchedule, StageConfig


class DPOConfig(StageConfig, HeldOutSchedule):
    """Offline preference optimisation of the SFT policy against a frozen reference; its held-out
    measure is the task accuracy of greedy answers where the eval prompts have answers, else the
    implicit reward's accuracy on the eval pairs."""

    learning_rate: float = Field(5e-4, gt=0)
    loss_type: str | list[str] = Field("sigmoid", description=f"DPO losses: {', '.join(DPO_LOSS_TYPES)}")
    loss_weights: list[float] | None = Field(
        None, description="one weight per loss_type entry (e.g. [1.0, 0.2] for [sigmoid, sft]); None: all 1"
    )
    beta: float = Field(0.1, gt=0)
    eval_max_new_tokens: int = Field(
        48, ge=1, description="with eval_every and answers: the tokens each greedy held-out answer may take"
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    reference_free: bool = Field(False, description="compare against a uniform reference (log p_ref = 0)")
    max_prompt_length: int | None = None
    group_by_length: bool = Field(
        True,
        description="pairs in batches of similar length (see StageConfig): on preference data of mixed "
        "lengths most of a random batch is padding",
    )
    precompute_reference: bool = Field(
        True,
        description="compute the reference's log-probs once before training (cached per "
        "reference weights and tokenized pairs) instead of running the reference at every step",
    )
    reference_cache_dir: str | None = Field(
        None, description="where cached reference log-probs live; None: $ALIGNFLOW_CACHE/reference-logps"
    )

    @model_validator(mode="before")
    @classmethod
    def _method_is_an_algorithm_now(cls, data: Any) -> Any:
        """``dpo.method`` chose ORPO or KTO inside this stage; each is its own algorithm now."""
        if isinstance(data, dict) and "method" in data:
            method = data["method"]
            if method != "dpo":
                raise ValueError(
                    f"dpo.method: {method!r} is its own algorithm now: set policy.algorithm={method} "
                    f"and its settings in a {method}: section"
                )
            data = {key: value for key, value in data.items() if key != "method"}
        return data

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
        return self
