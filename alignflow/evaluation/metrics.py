"""Policy and reward-model metrics computed from scores, completions and answers.

Pure functions over lists: they can be tested and reused without a model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alignflow.data.answers import task_accuracy
from alignflow.data.pairing import pairs_from_ranked
from alignflow.evaluation import metric_names as names
from alignflow.evaluation.calibration import pairwise_report
from alignflow.models.prompting import completion_text


def preference_pairs(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The labelled pairs among canonical records, then those of ranked rows (scored and
    prompt-only rows are not pairs)."""
    labelled = [r for r in records if r.get("kind", "pair") == "pair" and r.get("chosen") is not None]
    return labelled + pairs_from_ranked(r for r in records if r.get("kind") == "ranked")


def score_pairs(
    scorer: Callable[[Sequence[Any], Sequence[Any]], list[float]], pairs: Sequence[Mapping[str, Any]]
) -> tuple[list[float], list[float]]:
    """A reward model's scores of each pair's chosen and rejected response."""
    prompts = [p["prompt"] for p in pairs]
    chosen = scorer(prompts, [completion_text(p["chosen"]) for p in pairs])
    rejected = scorer(prompts, [completion_text(p["rejected"]) for p in pairs])
    return list(chosen), list(rejected)


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def normalised_mean_reward(
    scores: Sequence[float], chosen_scores: Sequence[float], rejected_scores: Sequence[float]
) -> float | None:
    """Mean reward on the held-out pairs' scale: 0 = the rejected side's mean, 1 = the chosen side's.

    Reward models have an arbitrary offset and scale; anchoring to the human-labelled pairs
    makes the number comparable across reward-model versions. None when the anchors
    coincide (a reward model that cannot tell chosen from rejected gives no scale).
    """
    low, high = mean(rejected_scores), mean(chosen_scores)
    policy = mean(scores)
    if policy is None or low is None or high is None or abs(high - low) < 1e-12:
        return None
    return (policy - low) / (high - low)


def reward_model_metrics(
    chosen_scores: Sequence[float], rejected_scores: Sequence[float]
) -> dict[str, float]:
    """Accuracy, mean margin and calibration (ECE) of a reward model on held-out pairs."""
    report = pairwise_report(chosen_scores, rejected_scores)
    return {
        names.REWARD_ACCURACY_EVAL: report.accuracy,
        names.REWARD_MARGIN_EVAL: report.margin_mean,
        names.CALIBRATION_ERROR: report.ece,
        names.REWARD_PAIRS_EVAL: float(report.n_pairs),
    }


def completion_lengths(completions: Sequence[str], tokenizer: Any | None = None) -> list[int]:
    """Lengths in tokens of ``tokenizer`` (characters without one)."""
    if tokenizer is None:
        return [len(c) for c in completions]
    return [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions]


def length_growth_ratio(lengths: Sequence[int], reference_lengths: Sequence[int]) -> float | None:
    """Mean length over the reference's: well above 1 is the classic reward-hacking signal."""
    ours, ref = mean(lengths), mean(reference_lengths)
    if ours is None or ref is None:
        return None
    return ours / max(ref, 1.0)


def answer_accuracy(
    completions: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    score: Callable[[str, Any], float] = task_accuracy,
    answer_key: str = "answer",
) -> float | None:
    """Mean task score over rows that carry a reference answer; None when none does."""
    scores = [
        score(completion, meta[answer_key])
        for completion, meta in zip(completions, metadata, strict=True)
        if meta and meta.get(answer_key) is not None
    ]
    return mean(scores)
