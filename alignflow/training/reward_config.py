"""Typed configuration of the reward-model stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from alignflow.training.stage_config import StageConfig


class Objective(BaseModel):
    """One head of a multi-objective reward model; the scalar reward is the weighted sum."""

    model_config = ConfigDict(extra="forbid")

    name: str = "reward"
    weight: float = 1.0


class RewardConfig(StageConfig):
    """A reward model: Bradley-Terry on pairs, regression on scores in [0, 1], or both at once.

    ``mixed`` fits one head to ratings (MSE toward the score) and to comparisons
    (Bradley-Terry on the difference), so feedback of both kinds trains one model.
    """

    mode: Literal["pairwise", "regression", "mixed"] = "pairwise"
    backbone: str = Field(
        "policy",
        description="'policy' (the model section's family), 'minilm' (packaged encoder), a path or hub id",
    )
    objectives: list[Objective] = Field(default_factory=lambda: [Objective()], min_length=1)
    center_rewards_coefficient: float | None = Field(None, ge=0.0)
    use_margin: bool = Field(False, description="pairwise: subtract each pair's margin inside the sigmoid")
    pooling: Literal["model", "mean", "answer"] = Field(
        "model",
        description="'model': the architecture's own head ([CLS] pooler, last token); 'mean': the head "
        "on the masked mean of the last hidden states (how sentence encoders such as MiniLM were trained); "
        "'answer': that mean over the response's tokens only, read in the context of its prompt",
    )
    length_debias: float = Field(
        0.0,
        ge=0.0,
        description="pairwise: strength of a length prior fitted on the train pairs and added to the "
        "Bradley-Terry logit during training only (product of experts), so the reward itself need not "
        "learn 'shorter/longer wins'; 0 = off, 1 = the fitted prior",
    )
    noisy_pair_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="pairwise: set aside this fraction of train pairs, those whose label an out-of-fold "
        "linear probe on the frozen backbone finds least plausible (confident learning); they are "
        "written to noisy_pairs.jsonl with their probability. 0 = train on every pair",
    )
    freeze_layers: int = Field(
        0,
        ge=0,
        description="freeze the embeddings and this many lowest transformer layers (speed, overfitting)",
    )
    stats_max_rows: int = Field(1024, ge=1, description="train rows used for the saved reward mean/std")
    group_by_length: bool = Field(
        True,
        description="pairs in batches of similar length (see StageConfig); on preference data of mixed "
        "lengths most of a random batch is padding. Mode 'regression' (ratings only) always trains on "
        "random batches",
    )

    @property
    def groups_by_length(self) -> bool:
        # ratings alone: similar lengths could mean similar scores (in the spec-002 tests' feedback
        # they did, and PPO on that reward model stopped learning); rows with pairs stay grouped
        return self.group_by_length and self.mode != "regression"

    @model_validator(mode="after")
    def _pair_options_need_one_pairwise_objective(self) -> RewardConfig:
        one_pairwise = self.mode == "pairwise" and len(self.objectives) == 1
        for name in ("length_debias", "noisy_pair_fraction"):
            if getattr(self, name) and not one_pairwise:
                raise ValueError(f"reward.{name} needs mode 'pairwise' with one objective")
        return self
