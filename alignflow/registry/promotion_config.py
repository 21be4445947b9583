"""The ``promotion`` section of the pipeline config: one threshold per gate.

Apart from ``promotion.py`` so that loading a config does not import MLflow.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PromotionConfig(BaseModel):
    """Thresholds of the promotion gates; ``None`` switches a gate off."""

    model_config = ConfigDict(extra="forbid")

    min_win_rate_vs_champion: float | None = Field(0.55, ge=0.0, le=1.0)
    min_win_rate_vs_reference: float | None = Field(
        0.5, ge=0.0, le=1.0, description="the first policy must win strictly more often than this"
    )
    max_kl: float | None = Field(None, ge=0.0, description="KL(policy || reference) budget in nats")
    max_length_growth: float | None = Field(2.0, gt=0.0, description="mean length / reference mean length")
    min_task_accuracy_gain: float | None = Field(None, description="task accuracy minus the reference's")
    min_reward_accuracy: float | None = Field(0.6, ge=0.0, le=1.0)
    max_reward_ece: float | None = Field(None, ge=0.0, le=1.0)
