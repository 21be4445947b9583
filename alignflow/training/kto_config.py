"""Typed configuration of the KTO stage: Kahneman-Tversky optimisation on desirable/undesirable answers.

KTO (Ethayarajh et al., 2024) needs no pairs: each answer is labelled desirable or not, and the
policy is pushed up on the first and down on the second relative to a frozen reference. A
pair gives one of each (its chosen and its rejected answer); the snapshot's ``unpaired`` rows
(``prompt``/``completion``/``label``) add single labelled answers.
"""

from __future__ import annotations

from pydantic import Field

from alignflow.training.stage_config import StageConfig


class KTOConfig(StageConfig):
    """Preference optimisation of the SFT policy from labelled single answers, against a frozen reference."""

    learning_rate: float = Field(5e-4, gt=0)
    beta: float = Field(0.1, gt=0, description="how far from the reference the policy may move")
    desirable_weight: float = Field(1.0, gt=0, description="weight of the desirable answers' loss")
    undesirable_weight: float = Field(
        1.0,
        gt=0,
        description="weight of the undesirable answers' loss; the paper keeps "
        "desirable_weight * n_desirable / (undesirable_weight * n_undesirable) within [1, 4/3]",
    )
    max_prompt_length: int | None = Field(None, ge=1, description="prompt tokens kept; None: TRL's default")
