"""Which reward model and policy algorithm fit a body of human feedback.

Feedback comes in two kinds (spec 002 and the data contract): ratings of one response
(``prompt, response, score``) and comparisons (``prompt, chosen, rejected``). The plan
follows the data unless the caller names an algorithm:

- ratings only  -> a score-regression reward model (MSE) and PPO on the rated prompts;
- comparisons   -> a Bradley-Terry reward model and DPO (after SFT on the chosen answers);
- both          -> one reward model trained on both (MSE on ratings + Bradley-Terry on
                   comparisons) and PPO on every prompt, so each kind shapes the policy.

A named algorithm that cannot work on the data (DPO with no pair anywhere) is refused
here, before any job starts, with a message that says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from alignflow.errors import InputError
from alignflow.training.registry import policy_algorithms, stage_spec

RewardMode = Literal["pairwise", "regression", "mixed"]


class PlanError(InputError):
    """The feedback cannot train what was asked for; the message says what is missing."""


@dataclass(frozen=True)
class FeedbackCounts:
    """How much of each kind of feedback there is, and the pairs ratings form per prompt."""

    scored: int = 0
    pairwise: int = 0
    formed_pairs: int = 0  # two ratings of one prompt with different scores make a pair

    @property
    def pairs(self) -> int:
        return self.pairwise + self.formed_pairs

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]]) -> FeedbackCounts:
        """Count canonical or exported records (``chosen`` marks a comparison; ``score`` a rating)."""
        scored, pairwise = 0, 0
        scores_by_prompt: dict[str, set[float]] = {}
        for record in records:
            if "chosen" in record:
                pairwise += 1
            elif record.get("score") is not None:
                scored += 1
                scores_by_prompt.setdefault(repr(record["prompt"]), set()).add(float(record["score"]))
        formed = sum(len(s) * (len(s) - 1) // 2 for s in scores_by_prompt.values())
        return cls(scored=scored, pairwise=pairwise, formed_pairs=formed)


@dataclass(frozen=True)
class FeedbackPlan:
    """A reward-model mode, a policy algorithm and whether SFT runs first."""

    reward_mode: RewardMode
    algorithm: str  # a registered policy algorithm
    run_sft: bool

    def overrides(self) -> list[str]:
        """The plan as pipeline-config overrides (``key=value``)."""
        items = [
            f"reward.mode={self.reward_mode}",
            f"policy.algorithm={self.algorithm}",
            f"policy.run_sft={str(self.run_sft).lower()}",
        ]
        return items + list(stage_spec(self.algorithm).reward_overrides)

    def describe(self) -> str:
        sft = "SFT, then " if self.run_sft else ""
        return f"{self.reward_mode} reward model; {sft}{self.algorithm.upper()}"


def reward_mode_for(counts: FeedbackCounts) -> RewardMode:
    if counts.scored and counts.pairwise:
        return "mixed"
    return "regression" if counts.scored else "pairwise"


def plan_for(counts: FeedbackCounts, algorithm: str | None = None) -> FeedbackPlan:
    """The plan for this feedback; ``algorithm`` (a registered policy algorithm) overrides the choice."""
    if counts.scored + counts.pairwise == 0:
        raise PlanError("there is no feedback to train on")
    if algorithm is not None and algorithm not in policy_algorithms():
        raise PlanError(f"algorithm {algorithm!r} is not one of {list(policy_algorithms())}")
    mode = reward_mode_for(counts)
    chosen = algorithm or ("dpo" if mode == "pairwise" else "ppo")
    pair_learner = stage_spec(chosen).needs_pairs
    if pair_learner and counts.pairs == 0:
        rated = [a for a in policy_algorithms() if not stage_spec(a).needs_pairs]
        raise PlanError(
            f"algorithm {chosen!r} needs preference pairs, and this feedback has none: {counts.scored} "
            "ratings, no two of them of one prompt with different scores, and no comparisons; "
            f"use one of {rated} (they learn from a reward model trained on the ratings)"
        )
    # a pair learner starts from a model fine-tuned on the chosen answers of comparisons; the
    # reward-model learners start from the base model, as spec 002's pipeline does
    return FeedbackPlan(reward_mode=mode, algorithm=chosen, run_sft=pair_learner and counts.pairwise > 0)
