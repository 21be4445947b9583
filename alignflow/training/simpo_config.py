"""Typed configuration of the SimPO stage: simple preference optimisation without a reference.

SimPO (Meng, Xia and Chen, 2024) rewards an answer with its length-normalised log-probability
scaled by ``beta`` and asks the chosen answer to win by at least the margin ``gamma``:

    loss = -log sigmoid(beta * (mean log p(chosen) - mean log p(rejected)) - gamma)

TRL runs it as its CPO trainer with ``loss_type="simpo"``; ``cpo_alpha > 0`` adds CPO's
negative log-likelihood term on the chosen answers (CPO-SimPO).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from alignflow.training.stage_config import StageConfig


class SimPOConfig(StageConfig):
    """Reference-free preference optimisation of the SFT policy on preference pairs."""

    # the demo's scale (tiny model from its SFT model: 3e-4 for 80 steps pushed the chosen answers'
    # log-probabilities from -0.3 to -3.6 and the task accuracy to 0); the paper's 7-8B runs: 3e-7-1e-6
    learning_rate: float = Field(1e-4, gt=0)
    beta: float = Field(
        2.0,
        gt=0,
        description="reward scale: an answer's reward is beta times its mean per-token log-probability "
        "(the paper: 2.0-2.5; TRL's CPO default of 0.1 is DPO's scale, too flat for mean log-probs)",
    )
    gamma: float = Field(
        1.0,
        ge=0,
        description="target reward margin of chosen over rejected (TRL's simpo_gamma); gamma/beta 0.5 "
        "as the paper recommends; 0: no margin",
    )
    cpo_alpha: float = Field(
        0.0,
        ge=0,
        description="weight of a negative log-likelihood term on the chosen answers: 0 is pure SimPO, "
        "> 0 CPO-SimPO (keeps the policy close to the chosen answers)",
    )
    label_smoothing: float = Field(
        0.0, ge=0.0, lt=0.5, description="the chance that a pair's label is flipped (conservative SimPO)"
    )
    max_prompt_length: int | None = Field(
        None,
        ge=1,
        description="prompt tokens kept, its end (the part next to the answer); None: half of max_length. "
        "TRL's CPO trainer cuts only the answer, so a prompt filling max_length would leave none",
    )
    group_by_length: bool = Field(
        True,
        description="pairs in batches of similar length (see StageConfig): on preference data of mixed "
        "lengths most of a random batch is padding",
    )

    @property
    def prompt_budget(self) -> int:
        """The prompt tokens a row keeps: ``max_prompt_length``, else half of ``max_length``."""
        return self.max_prompt_length if self.max_prompt_length is not None else self.max_length // 2

    @model_validator(mode="after")
    def _room_for_an_answer(self) -> SimPOConfig:
        if self.max_prompt_length is not None and self.max_prompt_length >= self.max_length:
            raise ValueError(
                f"simpo.max_prompt_length ({self.max_prompt_length}) must be below simpo.max_length "
                f"({self.max_length}): SimPO averages the answer's log-probabilities, and a row whose "
                "prompt fills max_length keeps no answer token"
            )
        return self
