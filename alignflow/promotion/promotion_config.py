"""The ``promotion`` section of the pipeline config: one threshold per gate.

Apart from ``promotion.py`` so that loading a config does not import MLflow.
Every rate, accuracy and difference gate is judged on the bound of its 95% interval
on the pinned set (lower bound for a minimum, upper bound for a maximum), never on
the point estimate; ``None`` switches a gate off.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PromotionConfig(BaseModel):
    """Thresholds of the promotion gates."""

    model_config = ConfigDict(extra="forbid")

    min_judged_rows: int = Field(
        30, ge=1, description="fewer judged rows fail a gate with reason insufficient_evidence"
    )
    min_task_accuracy_gain: float | None = Field(
        0.0, description="task accuracy minus the reference's: the lower bound must be above this"
    )
    min_rl_gain: float | None = Field(
        None,
        description="the RL stage's own gain over the model it started from (its SFT model, else the "
        "base): task accuracy minus its start's, lower bound >= this; without answers, each trusted "
        "judge's win rate against its start, lower bound >= 0.5 + this. None: not required",
    )
    max_task_accuracy_regression: float | None = Field(
        0.05,
        ge=0.0,
        description="champion's task accuracy minus the challenger's: lower bound of the gain >= -this",
    )
    min_win_rate_vs_champion: float | None = Field(
        0.4, ge=0.0, le=1.0, description="per trusted judge, lower bound (ties count half): not clearly worse"
    )
    min_win_rate_vs_reference: float | None = Field(
        0.5, ge=0.0, le=1.0, description="first policy, per trusted judge: lower bound must be above this"
    )
    max_kl: float | None = Field(None, ge=0.0, description="KL(policy || reference) budget in nats")
    max_length_growth: float | None = Field(
        2.0, gt=0.0, description="mean length / reference's (upper bound)"
    )
    min_length_ratio: float | None = Field(
        None,
        gt=0.0,
        description="mean length / reference's (lower bound): catches a policy that learnt to say less "
        "(e.g. to decline everything) to please its judge. None: not required",
    )
    max_length_growth_vs_champion: float | None = Field(
        1.5, gt=0.0, description="mean length / champion's (upper bound): catches padded answers"
    )
    max_loop_rate_increase: float | None = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="share of pinned completions that loop (evaluation.repetition) minus the reference's, "
        "on the same prompts: fails when even its lower bound is above this (the policy clearly loops "
        "more). Catches a policy that learnt to repeat itself (reward hacking, greedy loops) where its "
        "judges do not notice. None: not required",
    )
    min_reward_accuracy: float | None = Field(0.6, ge=0.0, le=1.0, description="pinned pairs, lower bound")
    max_reward_accuracy_regression: float | None = Field(
        0.05,
        ge=0.0,
        description="vs the champion reward model on pinned pairs: lower bound of the gain >= -this",
    )
    max_reward_ece: float | None = Field(None, ge=0.0, le=1.0)
    max_slice_regression: float | None = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="per slice of the pinned set (evaluation.slices), challenger's share right minus the "
        "champion's on its items: fails when even the upper bound is below -this (policy and reward)",
    )
    min_judge_agreement: float | None = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="a model judge counts only where it agrees with the verifiable answers on the items "
        "both decide (lower bound); None = count every independent judge unaudited",
    )
    allow_unaudited_judges: bool = Field(
        False,
        description="let a model judge count where no verifiable answer can audit it (open-ended data); "
        "the decision then says the judge was validated by its pinned-pair accuracy alone",
    )
    release: Literal["together", "separately"] = Field(
        "together",
        description="together: a run's reward model becomes champion only with its policy (it judges the "
        "next challengers and runs the label check); separately: on its own gates alone",
    )
    min_human_score_gain: float | None = Field(
        0.0,
        description="A/B on live ratings (promote --human): challenger's mean minus champion's, "
        "lower bound must be above this; min_judged_rows ratings per version at least",
    )
