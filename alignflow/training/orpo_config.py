"""Typed configuration of the ORPO stage: odds-ratio preference optimisation, no reference model.

ORPO (Hong, Lee and Thorne, 2024) adds to the chosen answers' negative log-likelihood a term
that raises the odds of the chosen answer over the rejected one, weighted by ``beta`` (the
paper's lambda): SFT and preference learning in one pass, without a frozen reference.
"""

from __future__ import annotations

from pydantic import Field

from alignflow.training.stage_config import StageConfig


class ORPOConfig(StageConfig):
    """Reference-free preference optimisation of the policy on preference pairs."""

    learning_rate: float = Field(5e-4, gt=0)
    beta: float = Field(0.1, gt=0, description="weight of the odds-ratio term (the paper's lambda)")
    max_prompt_length: int | None = Field(None, ge=1, description="prompt tokens kept; None: TRL's default")
    group_by_length: bool = Field(
        True,
        description="pairs in batches of similar length (see StageConfig): on preference data of mixed "
        "lengths most of a random batch is padding",
    )
