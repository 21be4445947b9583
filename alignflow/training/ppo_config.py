"""Typed configuration of the PPO stage: the PPO knobs and where its rewards come from.

The stage shares :class:`StageConfig`'s names so that generic tooling (``ppo.max_steps=N``
from the feedback service, ``ppo.learning_rate``) works unchanged; in PPO terms a *step*
is one iteration (sample a batch, score it, a few epochs of minibatch updates), the batch
size is the number of prompts sampled per iteration, and ``save_steps`` counts iterations.
The PPO names are accepted as well (``iterations``, ``batch_size``, ``save_every``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, ConfigDict, Field, model_validator

from alignflow.training.registry import REWARD_STAGE_REF
from alignflow.training.stage_config import StageConfig

VerifiableReward = Literal["correctness", "format"]
REWARD_SOURCES = ("reward_model", "correctness", "format")


class PPOStageConfig(StageConfig):
    """PPO on the snapshot's prompts, scored by a trained reward model and/or demo verifiers."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # StageConfig fields, re-declared for PPO's meaning, defaults and alternative names
    learning_rate: float = Field(1e-4, gt=0)
    max_steps: int = Field(
        40, ge=1, validation_alias=AliasChoices("max_steps", "iterations"), description="PPO iterations"
    )
    per_device_train_batch_size: int = Field(
        32,
        ge=1,
        validation_alias=AliasChoices("per_device_train_batch_size", "batch_size"),
        description="prompts sampled (one response each) per iteration",
    )
    save_steps: int = Field(
        10,
        ge=1,
        validation_alias=AliasChoices("save_steps", "save_every"),
        description="checkpoint every N iterations (the last iteration is always saved)",
    )
    logging_steps: int = Field(1, ge=1, description="log training metrics every N iterations")
    lr_scheduler_type: str = "constant"
    max_length: int = Field(
        256, ge=8, description="prompt tokens + max_new_tokens; longer prompts are left out"
    )

    # PPO proper
    mini_batch_size: int = Field(16, ge=1, description="responses per gradient step (at most the batch)")
    ppo_epochs: int = Field(2, ge=1, description="passes over each rollout")
    clip_range: float = Field(0.2, gt=0, description="policy ratio clip")
    value_clip: float | None = Field(0.2, gt=0, description="value-prediction clip (None: unclipped)")
    value_loss_coef: float = Field(0.5, ge=0)
    entropy_coef: float = Field(0.0, ge=0)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    init_kl_coef: float = Field(0.1, ge=0, description="starting coefficient of the KL penalty")
    adaptive_kl: bool = Field(True, description="move the coefficient toward target_kl (Ziegler et al.)")
    target_kl: float = Field(1.0, gt=0, description="target KL(policy || reference) per response, nats")
    kl_horizon: int = Field(1000, ge=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    max_new_tokens: int = Field(12, ge=1)
    temperature: float = Field(1.0, gt=0)

    # rewards
    reward_model: str | None = Field(
        REWARD_STAGE_REF,
        description="a reward-stage model dir; '@reward': the one the retraining flow trains; None: none",
    )
    normalize_reward: bool = Field(True, description="apply the reward model's saved mean/std")
    verifiable_rewards: list[VerifiableReward] = Field(
        default_factory=list, description="demo-task verifiers; they read each prompt's metadata.answer"
    )
    reward_weights: dict[str, float] = Field(
        default_factory=dict, description="weight per source (reward_model, correctness, format); default 1"
    )

    @model_validator(mode="after")
    def _check(self) -> PPOStageConfig:
        if not self.reward_model and not self.verifiable_rewards:
            raise ValueError("ppo: no reward source; set ppo.reward_model and/or ppo.verifiable_rewards")
        unknown = sorted(set(self.reward_weights) - set(REWARD_SOURCES))
        if unknown:
            raise ValueError(
                f"ppo.reward_weights: unknown source(s) {unknown}; known: {list(REWARD_SOURCES)}"
            )
        if self.max_new_tokens >= self.max_length:
            raise ValueError(
                f"ppo.max_new_tokens ({self.max_new_tokens}) leaves no room for a prompt in "
                f"ppo.max_length ({self.max_length})"
            )
        return self

    def weight(self, source: str) -> float:
        return self.reward_weights.get(source, 1.0)
