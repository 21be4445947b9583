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

from alignflow.data.answers import task_accuracy
from alignflow.data.checks import as_text
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.intervals import (
    BOUND_SUFFIXES,
    bootstrap_mean,
    disagreement,
    paired_bootstrap_difference,
    paired_bootstrap_ratio,
    paired_difference,
    put_estimate,
    wilson_of,
)
from alignflow.evaluation.judges import Judge, Scorer
from alignflow.evaluation.metric_names import (
    DECODING_DO_SAMPLE,
    DECODING_MAX_NEW_TOKENS,
    DECODING_REPETITION_PENALTY,
    DECODING_TEMPERATURE,
    DISTINCT_2,
    GOLDEN,
    LOOP_RATE,
    REFERENCE_DISTINCT_2,
    REPEATED_4GRAM_SHARE,
    REWARD_DISAGREEMENT_VS_CHAMPION,
    REWARD_SLICES_JUDGED,
    RL_START,
    RL_START_IS_REFERENCE,
    SLICES_JUDGED,
    TASK_DISAGREEMENT_VS_CHAMPION,
    WORST_SLICE_REWARD_ACCURACY,
    WORST_SLICE_TASK_ACCURACY,
    golden_key,
    judge_agreement_key,
    judge_pair_accuracy_key,
    judge_reward_agreement_key,
    win_rate_key,
)
from alignflow.evaluation.metrics import completion_lengths, score_pairs
from alignflow.evaluation.repetition import Repetition, loops
from alignflow.evaluation.report import EvalReport
from alignflow.evaluation.slices import SliceChange, group_items, slice_changes

# slices kept in the report (worst first): enough to see the broken ones and the next few
REPORTED_SLICES = 10
# the models whose pinned completions a sample row holds
MODELS_JUDGED = ("policy", "reference", RL_START, "champion")


def _answer_scores(
    completions: Sequence[str], answers: Sequence[Any], score: Callable[[str, Any], float]
) -> list[float | None]:
    return [None if a is None else score(c, a) for c, a in zip(completions, answers, strict=True)]


# per opponent: its task accuracy, ours minus its, our length over its, its loop share, ours minus its
_FIGURES_AGAINST = {
    "reference": (
        "reference_task_accuracy", "task_accuracy_gain", "length_growth_ratio",
        "reference_loop_rate", "loop_rate_vs_reference",
    ),
    RL_START: (
        "rl_start_task_accuracy", "rl_gain", "length_growth_vs_rl_start",
        "rl_start_loop_rate", "loop_rate_vs_rl_start",
    ),
    "champion": (
        "champion_task_accuracy", "task_accuracy_vs_champion", "length_growth_vs_champion",
        "champion_loop_rate", "loop_rate_vs_champion",
    ),
}  # fmt: skip


def rl_start_as_reference(
    metrics: Mapping[str, float | None], judges: Sequence[str]
) -> dict[str, float | None]:
    """The reference's figures under the RL start's names, for an RL stage that started from the
    reference itself (no SFT ran, or ``evaluation.reference: sft``): one model, measured once."""
    figures = zip(_FIGURES_AGAINST["reference"], _FIGURES_AGAINST[RL_START], strict=True)
    keys = [(golden_key(theirs), golden_key(ours)) for theirs, ours in figures]
    keys += [(win_rate_key(GOLDEN, j, "reference"), win_rate_key(GOLDEN, j, RL_START)) for j in judges]
    copied: dict[str, float | None] = {RL_START_IS_REFERENCE: 1.0}
    for theirs, ours in keys:
        for suffix in ("", *BOUND_SUFFIXES):
            if theirs + suffix in metrics:
                copied[ours + suffix] = metrics[theirs + suffix]
    return copied


def _lengths(completions: Sequence[str], tokenizer: Any | None) -> list[float]:
    return [float(x) for x in completion_lengths(completions, tokenizer)]


def _verifier_verdicts(ours: Sequence[float | None], theirs: Sequence[float | None]) -> list[float | None]:
    """1.0/0.0 where the verifiable answers decide between the two sides, None where they cannot
    (no answer, or both right or both wrong)."""
    return [
        None if a is None or b is None or a == b else float(a > b) for a, b in zip(ours, theirs, strict=True)
    ]


def agreement_outcomes(judge: Sequence[float | None], verifier: Sequence[float | None]) -> list[float]:
    """Per item both decide on: 1.0 when the judge picks the verifier's side (a tie is not agreement)."""
    return [float(j == v) for j, v in zip(judge, verifier, strict=True) if j is not None and v is not None]


def _put_slices(
    metrics: dict[str, float | None], key: str, count_key: str, changes: list[SliceChange]
) -> list[dict[str, Any]]:
    """The worst slice's change as a gate metric, how many slices were judged, and the report rows."""
    metrics[count_key] = float(len(changes))
    if changes:
        put_estimate(metrics, key, changes[0].change)
    return [c.as_dict() for c in changes[:REPORTED_SLICES]]


def policy_slices(
    prompts: Sequence[Any],
    metadata: Sequence[Mapping[str, Any]],
    policy: Sequence[str],
    champion: Sequence[str],
    ours: Sequence[float | None],
    theirs: Sequence[float | None],
    fields: Sequence[str],
    min_items: int,
) -> list[SliceChange]:
    """The challenger policy's change against the champion on every slice of the pinned prompts."""

    def example(i: int) -> dict[str, Any]:
        answer = metadata[i].get("answer")
        return {"prompt": as_text(prompts[i]), "answer": answer, "champion": champion[i], "policy": policy[i]}

    return slice_changes(group_items(prompts, metadata, fields), ours, theirs, min_items, example)


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
    metadata: Sequence[Mapping[str, Any]] | None = None,
    slice_fields: Sequence[str] = (),
    min_slice_items: int = 2,
    rl_start: list[str] | None = None,
) -> EvalReport:
    """Every pinned-set policy figure with its interval, from completions alone, and every
    pinned prompt's completions and verdicts (``samples``: the items a gate's figure counts).

    With a champion, also the challenger's change on each slice of the pinned prompts
    (``metadata``: each prompt's row metadata, for declared slices; answers alone otherwise).
    ``rl_start``: the completions of the model the RL stage started from, judged like the
    reference's (``golden/rl_gain``...); the reference's own list when the RL stage started
    from the reference, whose figures are then recorded under the RL start's names too.
    """
    metrics: dict[str, float | None] = {golden_key("answers"): float(sum(a is not None for a in answers))}
    ours, lengths = _answer_scores(policy, answers, score), _lengths(policy, tokenizer)
    put_estimate(metrics, golden_key("task_accuracy"), wilson_of(ours))
    repetition = Repetition.of(policy)
    put_estimate(metrics, LOOP_RATE, wilson_of(repetition.looping))
    put_estimate(metrics, REPEATED_4GRAM_SHARE, bootstrap_mean(repetition.repeated_share, seed=seed))
    metrics[DISTINCT_2] = repetition.distinct_2
    metadata = [
        {**(m or {}), "answer": a} for m, a in zip(metadata or [{}] * len(answers), answers, strict=True)
    ]
    info: dict[str, Any] = {"golden_prompts": len(prompts)}
    opponents = {"reference": reference}
    if rl_start is not None and rl_start is not reference:
        opponents[RL_START] = rl_start
        metrics[RL_START_IS_REFERENCE] = 0.0
    if champion is not None:
        opponents["champion"] = champion
    verdicts: dict[str, list[float | None]] = {}
    agreement: dict[str, list[float]] = {name: [] for name in judges or {}}
    for against, theirs in opponents.items():
        accuracy, gain, growth, loop_rate, loop_change = _FIGURES_AGAINST[against]
        their_scores = _answer_scores(theirs, answers, score)
        their_repetition = Repetition.of(theirs)
        put_estimate(metrics, golden_key(loop_rate), wilson_of(their_repetition.looping))
        put_estimate(
            metrics, golden_key(loop_change), paired_difference(repetition.looping, their_repetition.looping)
        )
        if against == "reference":
            metrics[REFERENCE_DISTINCT_2] = their_repetition.distinct_2
        if against == "champion":
            changes = policy_slices(
                prompts, metadata, policy, theirs, ours, their_scores, slice_fields, min_slice_items
            )
            info["policy_slices"] = _put_slices(metrics, WORST_SLICE_TASK_ACCURACY, SLICES_JUDGED, changes)
        put_estimate(metrics, golden_key(accuracy), wilson_of(their_scores))
        put_estimate(metrics, golden_key(gain), paired_bootstrap_difference(ours, their_scores, seed=seed))
        if against == "champion":
            metrics[TASK_DISAGREEMENT_VS_CHAMPION] = disagreement(ours, their_scores)
        put_estimate(
            metrics,
            golden_key(growth),
            paired_bootstrap_ratio(lengths, _lengths(theirs, tokenizer), seed=seed),
        )
        verifier = _verifier_verdicts(ours, their_scores)
        for name, judge in (judges or {}).items():
            verdicts[f"{name}_vs_{against}"] = judge.compare(prompts, policy, theirs, metadata)
            rate = bootstrap_mean(verdicts[f"{name}_vs_{against}"], seed=seed)
            put_estimate(metrics, win_rate_key(GOLDEN, name, against), rate)
            agreement[name] += agreement_outcomes(verdicts[f"{name}_vs_{against}"], verifier)
    if rl_start is not None and rl_start is reference:
        metrics |= rl_start_as_reference(metrics, list(judges or {}))
        info[RL_START] = "the reference itself: its figures are the reference's, measured once"
    for name, outcomes in agreement.items():  # the judges' audit: only where the answers decide
        if outcomes:
            put_estimate(metrics, judge_agreement_key(name), wilson_of(outcomes))
    samples = []
    for i, prompt in enumerate(prompts):
        row: dict[str, Any] = {"prompt": as_text(prompt)}
        row |= {"policy": policy[i], "reference": reference[i]}
        row |= {RL_START: opponents[RL_START][i]} if RL_START in opponents else {}
        row |= {"champion": champion[i]} if champion is not None else {}
        row |= {"answer": answers[i]} if answers[i] is not None else {}
        row |= {f"loops/{model}": loops(row[model]) for model in MODELS_JUDGED if model in row}
        row |= {f"verdict/{k}": v[i] for k, v in verdicts.items()}
        samples.append(row)
    return EvalReport(metrics=metrics, samples=samples, info=info)


def reward_pair_outcomes(scorer: Scorer, pairs: Sequence[Mapping[str, Any]]) -> list[float]:
    """1.0 where the reward model ranks the labelled chosen response above the rejected one."""
    chosen, rejected = score_pairs(scorer, pairs)
    return [1.0 if c > r else 0.0 for c, r in zip(chosen, rejected, strict=True)]


def reward_slices(
    pairs: Sequence[Mapping[str, Any]],
    ours: Sequence[float],
    theirs: Sequence[float],
    fields: Sequence[str],
    min_items: int,
) -> list[SliceChange]:
    """The challenger reward model's pair accuracy against the champion's on every slice."""
    from alignflow.models.prompting import completion_text

    def example(i: int) -> dict[str, Any]:
        pair = pairs[i]
        chosen, rejected = completion_text(pair["chosen"]), completion_text(pair["rejected"])
        return {"prompt": as_text(pair["prompt"]), "chosen": chosen, "rejected": rejected}

    groups = group_items([p["prompt"] for p in pairs], [p.get("metadata") for p in pairs], fields)
    return slice_changes(groups, ours, theirs, min_items, example)


def judge_beside_reward_model(
    judge: Any, pairs: Sequence[Mapping[str, Any]], scorer: Scorer | None = None
) -> EvalReport:
    """A scoring judge's accuracy on the pinned pairs and, where the run has a reward model,
    how often the two rank a pair alike (``judge.score`` maps prompts and answers to scores)."""
    metrics: dict[str, float | None] = {}
    ours = reward_pair_outcomes(judge.score, pairs)
    put_estimate(metrics, judge_pair_accuracy_key(judge.name), wilson_of(ours))
    if scorer is not None:
        theirs = reward_pair_outcomes(scorer, pairs)
        alike = [1.0 if a == b else 0.0 for a, b in zip(ours, theirs, strict=True)]
        put_estimate(metrics, judge_reward_agreement_key(judge.name), wilson_of(alike))
    return EvalReport(metrics=metrics)


def judge_reward_model(
    pairs: Sequence[Mapping[str, Any]],
    scorer: Scorer,
    champion: Scorer | None = None,
    seed: int = 0,
    slice_fields: Sequence[str] = (),
    min_slice_items: int = 2,
) -> EvalReport:
    """Pinned-pair accuracy of a new reward model, and its difference from the champion's
    overall and on every slice of the pinned pairs."""
    metrics: dict[str, float | None] = {}
    info: dict[str, Any] = {"golden_pairs": len(pairs)}
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
        metrics[REWARD_DISAGREEMENT_VS_CHAMPION] = disagreement(ours, theirs)
        changes = reward_slices(pairs, ours, theirs, slice_fields, min_slice_items)
        info["reward_slices"] = _put_slices(
            metrics, WORST_SLICE_REWARD_ACCURACY, REWARD_SLICES_JUDGED, changes
        )
    return EvalReport(metrics=metrics, info=info)


def golden_prompts(records: Sequence[Mapping[str, Any]], limit: int) -> tuple[list[Any], list[Any]]:
    """Distinct pinned prompts (up to ``limit``) and their reference answers (None where unknown)."""
    prompts, answers, _ = golden_rows(records, limit)
    return prompts, answers


def golden_rows(
    records: Sequence[Mapping[str, Any]], limit: int
) -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """Distinct pinned prompts, their answers and their rows' metadata (declared slices)."""
    from alignflow.data.split import distinct_prompt_rows

    rows = distinct_prompt_rows(records, limit)
    metadata = [dict(r["metadata"] or {}) for r in rows]
    return [r["prompt"] for r in rows], [m.get("answer") for m in metadata], metadata


def judge_on_golden(
    records: Sequence[Mapping[str, Any]],
    generate: Callable[[Any, Any, list[Any]], list[str]],
    policy: tuple[Any, Any],
    reference: Any,
    champion: tuple[Any, Any] | None,
    judges: Mapping[str, Judge],
    config: EvaluationConfig,
    rl_start: Any | None = None,
) -> EvalReport:
    """Generate on the pinned prompts with each model, then :func:`judge_policy_completions`.

    ``rl_start``: the model the RL stage started from (sharing the policy's tokenizer), or
    ``reference`` itself when that is where it started: then it generates once."""
    prompts, answers, metadata = golden_rows(records, config.max_prompts)
    if not prompts:
        raise ValueError("the pinned set has no prompts to judge the policy on")
    model, tokenizer = policy
    ours, theirs = generate(model, tokenizer, prompts), generate(reference, tokenizer, prompts)
    start = theirs if rl_start is reference else None
    if rl_start is not None and start is None:
        start = generate(rl_start, tokenizer, prompts)
    report = judge_policy_completions(
        prompts,
        answers,
        ours,
        theirs,
        generate(*champion, prompts) if champion is not None else None,
        judges,
        tokenizer,
        seed=config.seed,
        metadata=metadata,
        slice_fields=config.slice_fields,
        min_slice_items=config.min_slice_items,
        rl_start=start,
    )
    report.metrics |= decoding_metrics(config)
    return report


def decoding_metrics(config: EvaluationConfig) -> dict[str, float | None]:
    """The settings every pinned completion was decoded with, kept beside the figures they
    produced (a loop share under greedy decoding is not one under sampling). No repetition
    penalty is applied: the figures show the model's own habit."""
    decoded = config.decoding()
    return {
        DECODING_MAX_NEW_TOKENS: float(decoded["max_new_tokens"]),
        DECODING_DO_SAMPLE: float(decoded["do_sample"]),
        DECODING_TEMPERATURE: float(decoded["temperature"]) if decoded["do_sample"] else None,
        DECODING_REPETITION_PENALTY: 1.0,
    }
