"""Judging a challenger on the pinned set, by judges that do not come from its own run.

The challenger policy answers every pinned prompt beside its reference and the current
champion. The verifiable answer judge scores each completion; every preference judge
(the champion reward model, the new reward model, a plugged-in LLM judge) compares the
challenger with the reference and with the champion row by row. Every figure comes with
its 95% interval and the number of judged rows (:mod:`alignflow.evaluation.intervals`);
the promotion gates decide which judges count and read the bounds.

Metric keys: ``golden/<name>`` is the point estimate; ``/low``, ``/high`` and ``/n`` beside
it are the interval and the rows behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alignflow.data.checks import as_text
from alignflow.data.demo import task_accuracy
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.intervals import (
    bootstrap_mean,
    paired_bootstrap_difference,
    paired_bootstrap_ratio,
    put_estimate,
    wilson_of,
)
from alignflow.evaluation.judges import Judge, Scorer
from alignflow.evaluation.metric_names import GOLDEN, golden_key, win_rate_key
from alignflow.evaluation.metrics import completion_lengths, score_pairs
from alignflow.evaluation.report import EvalReport


def _answer_scores(
    completions: Sequence[str], answers: Sequence[Any], score: Callable[[str, Any], float]
) -> list[float | None]:
    return [None if a is None else score(c, a) for c, a in zip(completions, answers, strict=True)]


# per opponent: its task accuracy, ours minus its, our length over its
_FIGURES_AGAINST = {
    "reference": ("reference_task_accuracy", "task_accuracy_gain", "length_growth_ratio"),
    "champion": ("champion_task_accuracy", "task_accuracy_vs_champion", "length_growth_vs_champion"),
}


def _lengths(completions: Sequence[str], tokenizer: Any | None) -> list[float]:
    return [float(x) for x in completion_lengths(completions, tokenizer)]


def judge_policy_completions(
    prompts: list[Any],
    answers: list[Any],
    policy: list[str],
    reference: list[str],
    champion: list[str] | None = None,
    judges: Mapping[str, Judge] | None = None,
    tokenizer: Any | None = None,
    score: Callable[[str, Any], float] = task_accuracy,
    seed: int = 0,
    num_samples: int = 20,
) -> EvalReport:
    """Every pinned-set policy figure with its interval, from completions alone."""
    metrics: dict[str, float | None] = {golden_key("answers"): float(sum(a is not None for a in answers))}
    ours, lengths = _answer_scores(policy, answers, score), _lengths(policy, tokenizer)
    put_estimate(metrics, golden_key("task_accuracy"), wilson_of(ours))
    metadata = [{"answer": a} for a in answers]
    opponents = {"reference": reference, **({"champion": champion} if champion is not None else {})}
    verdicts: dict[str, list[float | None]] = {}
    for against, theirs in opponents.items():
        accuracy, gain, growth = _FIGURES_AGAINST[against]
        their_scores = _answer_scores(theirs, answers, score)
        put_estimate(metrics, golden_key(accuracy), wilson_of(their_scores))
        put_estimate(metrics, golden_key(gain), paired_bootstrap_difference(ours, their_scores, seed=seed))
        put_estimate(
            metrics,
            golden_key(growth),
            paired_bootstrap_ratio(lengths, _lengths(theirs, tokenizer), seed=seed),
        )
        for name, judge in (judges or {}).items():
            verdicts[f"{name}_vs_{against}"] = judge.compare(prompts, policy, theirs, metadata)
            rate = bootstrap_mean(verdicts[f"{name}_vs_{against}"], seed=seed)
            put_estimate(metrics, win_rate_key(GOLDEN, name, against), rate)
    samples = []
    for i, prompt in enumerate(prompts[:num_samples]):
        row = {"prompt": as_text(prompt)}
        row |= {"policy": policy[i], "reference": reference[i]}
        row |= {"champion": champion[i]} if champion is not None else {}
        row |= {"answer": answers[i]} if answers[i] is not None else {}
        row |= {f"verdict/{k}": v[i] for k, v in verdicts.items()}
        samples.append(row)
    return EvalReport(metrics=metrics, samples=samples, info={"golden_prompts": len(prompts)})


def reward_pair_outcomes(scorer: Scorer, pairs: Sequence[Mapping[str, Any]]) -> list[float]:
    """1.0 where the reward model ranks the labelled chosen response above the rejected one."""
    chosen, rejected = score_pairs(scorer, pairs)
    return [1.0 if c > r else 0.0 for c, r in zip(chosen, rejected, strict=True)]


def judge_reward_model(
    pairs: Sequence[Mapping[str, Any]], scorer: Scorer, champion: Scorer | None = None, seed: int = 0
) -> EvalReport:
    """Pinned-pair accuracy of a new reward model, and its difference from the champion's."""
    metrics: dict[str, float | None] = {}
    ours = reward_pair_outcomes(scorer, pairs)
    put_estimate(metrics, golden_key("reward_accuracy"), wilson_of(ours))
    if champion is not None:
        theirs = reward_pair_outcomes(champion, pairs)
        put_estimate(metrics, golden_key("champion_reward_accuracy"), wilson_of(theirs))
        put_estimate(
            metrics,
            golden_key("reward_accuracy_vs_champion"),
            paired_bootstrap_difference(ours, theirs, seed=seed),
        )
    return EvalReport(metrics=metrics, info={"golden_pairs": len(pairs)})


def golden_prompts(records: Sequence[Mapping[str, Any]], limit: int) -> tuple[list[Any], list[Any]]:
    """Distinct pinned prompts (up to ``limit``) and their reference answers (None where unknown)."""
    from alignflow.evaluation.evaluate import held_out_prompts

    rows = held_out_prompts(records, limit)
    return [r["prompt"] for r in rows], [(r["metadata"] or {}).get("answer") for r in rows]


def judge_on_golden(
    records: Sequence[Mapping[str, Any]],
    generate: Callable[[Any, Any, list[Any]], list[str]],
    policy: tuple[Any, Any],
    reference: Any,
    champion: tuple[Any, Any] | None,
    judges: Mapping[str, Judge],
    config: EvaluationConfig,
) -> EvalReport:
    """Generate on the pinned prompts with each model, then :func:`judge_policy_completions`."""
    prompts, answers = golden_prompts(records, config.max_prompts)
    if not prompts:
        raise ValueError("the pinned set has no prompts to judge the policy on")
    model, tokenizer = policy
    return judge_policy_completions(
        prompts,
        answers,
        generate(model, tokenizer, prompts),
        generate(reference, tokenizer, prompts),
        generate(*champion, prompts) if champion is not None else None,
        judges,
        tokenizer,
        seed=config.seed,
        num_samples=config.num_samples,
    )
