"""Typed configuration of the PPO stage: :class:`alignflow.rl.PPOConfig` itself, plus how the
stage runs and where its rewards come from.

The PPO knobs keep the research API's names (``num_iterations``, ``batch_size``,
``clip_param``, ``kl_coef``, ``num_epochs``, ``gae_lambda``... and the spec's aliases), so
one config drives both. The trainer-generic names (``ppo.max_steps``,
``ppo.per_device_train_batch_size``, ``ppo.save_steps``: what the feedback service sets)
are accepted on input and readable as properties. In PPO terms a *step* is one iteration
(sample a batch of prompts, score it, a few epochs of minibatch updates).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, ConfigDict, Field, model_validator

from alignflow.rl.ppo_config import PPOConfig
from alignflow.training.registry import REWARD_STAGE_REF
from alignflow.training.stage_config import RunConfig

VerifiableReward = Literal["correctness", "format"]
REWARD_SOURCES = ("reward_model", "correctness", "format")
# the research API's defaults are the spec's (a 2B model); the pipeline's suit the tiny demo
# policy on a CPU, and any of them can be set in the ppo section under either name
PIPELINE_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-4,
    "num_iterations": 40,
    "batch_size": 32,
    "mini_batch_size": 16,
    "num_epochs": 2,
    "value_clip": 0.2,
    "entropy_coef": 0.0,
    "gamma": 1.0,
    "target_kl": 1.0,
    "kl_horizon": 1000,
    "max_new_tokens": 12,
    "save_every": 10,
    "max_length": 256,
    "logging_steps": 1,
    "lr_scheduler_type": "constant",
}
SET_BY_THE_STAGE = ("model_name", "output_dir")  # the model section and the stage's folder decide these


class PPOStageConfig(RunConfig, PPOConfig):
    """PPO on the snapshot's prompts, scored by a trained reward model and/or demo verifiers.

    ``save_every`` counts iterations (the last is always saved); ``eval_every`` scores greedy
    answers to the eval split's prompts every that many iterations.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

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
    loop_penalty: float = Field(
        0.0,
        ge=0.0,
        description="subtracted from the reward of a sampled response that loops (evaluation.repetition): "
        "a learnt reward model scores \"I'm sorry. I'm sorry. ...\" like any answer, and PPO finds such "
        "text first; in the reward model's normalised units (1.0: one standard deviation); 0: off",
    )
    hand_on: Literal["best", "last"] = Field(
        "best",
        description="with eval_every: the policy of the iteration whose greedy held-out reward was highest "
        "(0: the start, when none beat it), or the last iteration's; the stage says which (handed_on_step)",
    )

    @model_validator(mode="before")
    @classmethod
    def _pipeline_defaults(cls, data: Any) -> Any:
        """Fill :data:`PIPELINE_DEFAULTS` for the fields given under none of their names."""
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        for name, value in PIPELINE_DEFAULTS.items():
            alias = cls.model_fields[name].validation_alias
            names = {name, *(alias.choices if isinstance(alias, AliasChoices) else ())}
            if not names & set(filled):
                filled[name] = value
        return filled

    @model_validator(mode="after")
    def _check(self) -> PPOStageConfig:
        given = [name for name in SET_BY_THE_STAGE if getattr(self, name) is not None]
        if given:
            raise ValueError(f"ppo: {given} are set by the pipeline (model.name, the stage's output folder)")
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

    @property
    def max_steps(self) -> int:
        return self.num_iterations

    @property
    def per_device_train_batch_size(self) -> int:
        return self.batch_size

    def weight(self, source: str) -> float:
        return self.reward_weights.get(source, 1.0)
