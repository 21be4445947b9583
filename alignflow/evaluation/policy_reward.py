"""What a trained policy earns: its reward under a reward model on prompts it did not train on.

This is the number spec 002 reports as ``rewardMean ± rewardStd``: greedy completions of
held-out prompts, scored on the reward model's own scale (a regression model predicts a
score in [0, 1]; a Bradley-Terry model a logit), not normalised, so versions trained on
the same reward model can be compared by it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.evaluation.metric_names import POLICY_REWARD_MEAN, POLICY_REWARD_N, POLICY_REWARD_STD


@dataclass(frozen=True)
class RewardStats:
    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, rewards: Sequence[float]) -> RewardStats:
        if not rewards:
            raise ValueError("no rewards to summarise")
        values = [float(r) for r in rewards]
        std = statistics.pstdev(values) if len(values) > 1 else 0.0
        return cls(mean=statistics.fmean(values), std=std, n=len(values))

    def as_metrics(self) -> dict[str, float]:
        return {POLICY_REWARD_MEAN: self.mean, POLICY_REWARD_STD: self.std, POLICY_REWARD_N: float(self.n)}


def policy_reward(
    policy_dir: str | Path,
    reward_dir: str | Path,
    prompts: Sequence[Any],
    max_new_tokens: int = 32,
    batch_size: int = 16,
    scorer: Callable[[list[Any], list[str]], Sequence[float]] | None = None,
    device: str | None = None,
) -> RewardStats:
    """Greedy completions of ``prompts`` by the saved policy, scored raw by the saved reward model.

    ``scorer(prompts, completions)`` scores instead of the model in ``reward_dir`` (a reward
    model object whose own code reshapes its rewards).
    """
    from alignflow.models import load_causal_lm
    from alignflow.models.prompting import generate
    from alignflow.models.reward_scorer import load_reward_scorer

    if not prompts:
        raise ValueError("no held-out prompts to measure the policy's reward on")
    # where the policy trained (``device``), so the measure runs there too
    model, tokenizer = load_causal_lm(policy_dir, merge_lora=True, device=device)
    completions = generate(
        model, tokenizer, list(prompts), max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    if scorer is None:
        scorer = load_reward_scorer(reward_dir, normalize=False, batch_size=batch_size, device=device)
    return RewardStats.of(scorer(list(prompts), completions))
