"""Typed configuration of the supervised fine-tuning stage."""

from __future__ import annotations

from pydantic import Field

from alignflow.training.stage_config import StageConfig


class SFTConfig(StageConfig):
    """SFT on the preferred responses (and on scored responses at or above ``min_score``)."""

    completion_only_loss: bool = Field(True, description="loss on the response tokens only")
    min_score: float = Field(1.0, ge=0.0, le=1.0, description="scored rows below this are not imitated")
    packing: bool = False
