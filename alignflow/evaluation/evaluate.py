"""The evaluation stage: score a reward model on held-out pairs and a policy against its
reference (and the current champion) on held-out prompts.

:func:`evaluate_reward_model` and :func:`evaluate_policy_completions` work on scores and
texts alone; :func:`evaluate_policy` generates the completions first, and
:func:`evaluate_paths` loads everything from saved directories for the pipeline task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from alignflow.data.checks import as_text, check_record
from alignflow.data.normalize import RowError, normalize_row
from alignflow.data.split import distinct_prompt_rows
from alignflow.evaluation import metric_names as names
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.judge_registry import OUTSIDE_JUDGE, JudgeInputs, build_pinned_set_judges
from alignflow.evaluation.judges import AnswerJudge, Judge, RewardModelJudge, Scorer, win_rate
from alignflow.evaluation.kl import sampled_kl
from alignflow.evaluation.metrics import (
    answer_accuracy,
    completion_lengths,
    length_growth_ratio,
    mean,
    normalised_mean_reward,
    preference_pairs,
    reward_model_metrics,
    score_pairs,
)
from alignflow.evaluation.policy_reward import RewardStats
from alignflow.evaluation.repetition import loop_rate
from alignflow.evaluation.report import EvalReport
from alignflow.models.prompting import generate, text_key


def _raw(scorer: Scorer) -> Scorer:
    """Un-normalised scores when the scorer offers them: calibration needs the real margins."""
    return getattr(scorer, "raw", scorer)


def checked_records(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records as the data stage would keep them: a raw row (no ``kind``) is normalised and
    every pair is checked.

    The Python API skips the data stage, so a bad row (a boolean response, a missing side)
    is refused here with its index and field instead of failing inside the scorer.
    """
    checked = []
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise ValueError(f"records[{index}] is {type(record).__name__}, not a mapping")
        try:
            canonical = record if "kind" in record else normalize_row(dict(record))
            if canonical["kind"] in ("pair", "ranked"):
                check_record(canonical)
        except RowError as error:
            raise ValueError(f"records[{index}] field {error.field!r}: {error.code}: {error}") from None
        checked.append(canonical)
    return checked


def held_out_pairs(records: Sequence[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    return preference_pairs(records)[:limit]


def evaluate_reward_model(
    scorer: Scorer, records: Sequence[Mapping[str, Any]], config: EvaluationConfig | None = None
) -> EvalReport:
    """Accuracy, margin and calibration of a reward model on held-out pairs."""
    config = config or EvaluationConfig()
    pairs = held_out_pairs(checked_records(records), config.max_pairs)
    if not pairs:
        raise ValueError(
            "no held-out pairs (kind='pair' with chosen/rejected) to evaluate the reward model on"
        )
    chosen, rejected = score_pairs(_raw(scorer), pairs)
    return EvalReport(
        metrics=reward_model_metrics(chosen, rejected),
        series={"reward/chosen": list(chosen), "reward/rejected": list(rejected)},
    )


def evaluate_reward_regression(
    scorer: Scorer, records: Sequence[Mapping[str, Any]], limit: int
) -> EvalReport:
    """How close a reward model's raw scores come to held-out ratings (MSE, rank correlation)."""
    import pandas as pd

    rated = [r for r in records if r.get("kind") == "scored" and r.get("score") is not None][:limit]
    if not rated:
        raise ValueError("no held-out ratings (kind='scored') to evaluate the reward model on")
    predicted = _raw(scorer)([r["prompt"] for r in rated], [r["completion"] for r in rated])
    truth = [float(r["score"]) for r in rated]
    metrics: dict[str, float | None] = {
        names.REWARD_MSE: mean([(p - t) ** 2 for p, t in zip(predicted, truth, strict=True)]),
        names.REWARD_RATINGS: float(len(rated)),
    }
    if len(set(truth)) > 1 and len(set(predicted)) > 1:
        metrics[names.REWARD_SPEARMAN] = float(pd.Series(predicted).corr(pd.Series(truth), method="spearman"))
    return EvalReport(metrics=metrics, series={"reward/rated": list(predicted)})


def evaluate_reward_on_held_out(
    scorer: Scorer, records: Sequence[Mapping[str, Any]], config: EvaluationConfig
) -> EvalReport:
    """Pairs where the held-out data has them, ratings where it has them: whatever it holds."""
    report = EvalReport()
    if held_out_pairs(records, 1):
        report = report.merge(evaluate_reward_model(scorer, records, config))
    if any(r.get("kind") == "scored" for r in records):
        report = report.merge(evaluate_reward_regression(scorer, records, config.max_pairs))
    if not report.metrics:
        raise ValueError("no held-out pairs or ratings to evaluate the reward model on")
    return report


def build_judges(config: EvaluationConfig, scorer: Scorer | None) -> list[Judge]:
    judges: list[Judge] = []
    for name in config.judges:
        if name == "reward" and scorer is not None:
            judges.append(RewardModelJudge(scorer, config.tie_margin))
        elif name == "answer":
            judges.append(AnswerJudge())
    return judges


def _win_rates(
    judges: Sequence[Judge],
    primary: str,
    prompts: list[Any],
    ours: list[str],
    theirs: list[str],
    metadata: list[Mapping[str, Any]],
    against: str,
) -> dict[str, float | None]:
    metrics: dict[str, float | None] = {}
    for judge in judges:
        rate = win_rate(judge.compare(prompts, ours, theirs, metadata))
        metrics[names.win_rate_key(names.EVAL, judge.name, against)] = rate
        if judge.name == primary:
            metrics[names.win_rate_key(names.EVAL, None, against)] = rate
    return metrics


def evaluate_policy_completions(
    prompts: list[Any],
    metadata: list[Mapping[str, Any]],
    policy: list[str],
    reference: list[str],
    champion: list[str] | None = None,
    scorer: Scorer | None = None,
    judges: Sequence[Judge] | None = None,
    config: EvaluationConfig | None = None,
    tokenizer: Any | None = None,
    pair_records: Sequence[Mapping[str, Any]] = (),
) -> EvalReport:
    """Every policy metric that needs only the completions (KL needs the models: see
    :func:`evaluate_policy`). Win rates, reward, length drift and task accuracy."""
    config = config or EvaluationConfig()
    judges = list(judges) if judges is not None else build_judges(config, scorer)
    metrics: dict[str, float | None] = {}
    metrics |= _win_rates(judges, config.primary_judge, prompts, policy, reference, metadata, "reference")
    if champion is not None:
        metrics |= _win_rates(judges, config.primary_judge, prompts, policy, champion, metadata, "champion")
    series: dict[str, list[float]] = {}
    if scorer is not None:
        policy_scores, reference_scores = scorer(prompts, policy), scorer(prompts, reference)
        series |= {"reward/policy": list(policy_scores), "reward/reference": list(reference_scores)}
        metrics[names.REWARD_MEAN] = mean(policy_scores)
        metrics[names.REFERENCE_REWARD_MEAN] = mean(reference_scores)
        metrics |= RewardStats.of(_raw(scorer)(prompts, policy)).as_metrics()
        pairs = held_out_pairs(pair_records, config.max_pairs)
        if pairs:
            chosen, rejected = score_pairs(scorer, pairs)
            metrics[names.NORMALISED_REWARD] = normalised_mean_reward(policy_scores, chosen, rejected)
    lengths = completion_lengths(policy, tokenizer)
    reference_lengths = completion_lengths(reference, tokenizer)
    series |= {
        "length/policy": [float(x) for x in lengths],
        "length/reference": [float(x) for x in reference_lengths],
    }
    metrics[names.LENGTH_MEAN] = mean(lengths)
    metrics[names.REFERENCE_LENGTH_MEAN] = mean(reference_lengths)
    metrics[names.LENGTH_GROWTH_RATIO_EVAL] = length_growth_ratio(lengths, reference_lengths)
    metrics[names.LOOP_RATE_EVAL] = loop_rate(policy)
    metrics[names.REFERENCE_LOOP_RATE_EVAL] = loop_rate(reference)
    accuracy = answer_accuracy(policy, metadata)
    reference_accuracy = answer_accuracy(reference, metadata)
    metrics[names.TASK_ACCURACY_EVAL] = accuracy
    metrics[names.REFERENCE_TASK_ACCURACY_EVAL] = reference_accuracy
    if accuracy is not None and reference_accuracy is not None:
        metrics[names.TASK_ACCURACY_GAIN_EVAL] = accuracy - reference_accuracy
    if champion is not None:
        metrics[names.CHAMPION_TASK_ACCURACY_EVAL] = answer_accuracy(champion, metadata)
    samples = [
        {"prompt": as_text(p), "policy": a, "reference": b}
        | ({"champion": champion[i]} if champion is not None else {})
        | ({"answer": metadata[i].get("answer")} if metadata[i] else {})
        for i, (p, a, b) in enumerate(zip(prompts, policy, reference, strict=True))
    ][: config.num_samples]
    return EvalReport(metrics=metrics, samples=samples, series=series, info={"eval_prompts": len(prompts)})


def generate_answers(model: Any, tokenizer: Any, prompts: list[Any], config: EvaluationConfig) -> list[str]:
    """Completions with the evaluation's decoding settings (greedy unless the config samples)."""
    settings = config.decoding()
    return generate(model, tokenizer, prompts, batch_size=config.batch_size, seed=config.seed, **settings)


Complete = Callable[[Any, Any, list[Any]], list[str]]


class RememberedAnswers:
    """:func:`generate_answers` that generates each (model, prompt) once per evaluation: the
    pinned set is frozen from the first eval split, so both often ask the same prompts (on
    HH-RLHF all of them), and generation is most of an evaluation's time. Keyed by the model
    object, so it lives only while those models do (one evaluation)."""

    def __init__(self, config: EvaluationConfig) -> None:
        self.config = config
        self._answers: dict[tuple[int, str], str] = {}

    def __call__(self, model: Any, tokenizer: Any, prompts: list[Any]) -> list[str]:
        keys = [(id(model), text_key(p)) for p in prompts]
        todo = {key: prompt for key, prompt in zip(keys, prompts, strict=True) if key not in self._answers}
        if todo:
            fresh = generate_answers(model, tokenizer, list(todo.values()), self.config)
            self._answers.update(zip(todo, fresh, strict=True))
        return [self._answers[key] for key in keys]


def evaluate_policy(
    policy: Any,
    tokenizer: Any,
    reference: Any,
    records: Sequence[Mapping[str, Any]],
    scorer: Scorer | None = None,
    champion: tuple[Any, Any] | None = None,
    config: EvaluationConfig | None = None,
    complete: Complete | None = None,
) -> EvalReport:
    """Generate completions from policy, reference (and champion) and compute every metric.

    ``reference`` shares ``tokenizer`` with the policy (the policy was trained from it);
    ``champion`` is ``(model, tokenizer)`` of the current champion, or None. ``complete``
    generates (default: a :class:`RememberedAnswers` of ``config``).
    """
    config = config or EvaluationConfig()
    complete = complete or RememberedAnswers(config)
    rows = distinct_prompt_rows(records, config.max_prompts)
    if not rows:
        raise ValueError("no held-out prompts to evaluate the policy on")
    prompts, metadata = [r["prompt"] for r in rows], [r["metadata"] for r in rows]
    ours = complete(policy, tokenizer, prompts)
    theirs = complete(reference, tokenizer, prompts)
    best = complete(champion[0], champion[1], prompts) if champion is not None else None
    report = evaluate_policy_completions(
        prompts, metadata, ours, theirs, best, scorer, None, config, tokenizer, pair_records=records
    )
    if config.kl_samples:
        kl_prompts = [prompts[i % len(prompts)] for i in range(config.kl_samples)]
        report.metrics[names.KL_TO_REFERENCE] = sampled_kl(
            policy, reference, tokenizer, kl_prompts, config.max_new_tokens, config.batch_size, config.seed
        )
    return report


def evaluate_on_golden(
    golden_records: Sequence[Mapping[str, Any]],
    policy: tuple[Any, Any] | None,
    reference: Any | None,
    scorer: Scorer | None,
    champion: tuple[Any, Any] | None = None,
    champion_scorer: Scorer | None = None,
    config: EvaluationConfig | None = None,
    rl_start: Any | None = None,
    complete: Complete | None = None,
) -> EvalReport:
    """Reward model and policy judged on the pinned set, with intervals (see ``challenger``);
    ``rl_start``: the model the RL stage started from (``reference`` itself where it did)."""
    from alignflow.evaluation.challenger import judge_beside_reward_model, judge_on_golden, judge_reward_model

    config = config or EvaluationConfig()
    complete = complete or RememberedAnswers(config)
    report = EvalReport()
    pairs = held_out_pairs(golden_records, config.max_pairs)
    if scorer is not None and pairs:
        judged = judge_reward_model(
            pairs, _raw(scorer), champion_scorer, config.seed, config.slice_fields, config.min_slice_items
        )
        report = report.merge(judged)
    pinned_prompts = tuple(record["prompt"] for record in golden_records)
    judges = build_pinned_set_judges(JudgeInputs(config, scorer, champion_scorer, pinned_prompts))
    if OUTSIDE_JUDGE in judges and pairs:
        outside = judges[OUTSIDE_JUDGE]
        report = report.merge(judge_beside_reward_model(outside, pairs, _raw(scorer) if scorer else None))
    if policy is not None:
        report = report.merge(
            judge_on_golden(golden_records, complete, policy, reference, champion, judges, config, rl_start)
        )
    return report


def refuse_trained_on(snapshot_dir: str | Path, golden_records: Sequence[Mapping[str, Any]]) -> None:
    """No score on pinned rows the models trained on: raises when the snapshot's train split
    repeats a pinned prompt (the data stage stops such a version; this guards every other way in)."""
    from alignflow.data.snapshot import load_split, split_path
    from alignflow.evaluation.contamination import PinnedSetContamination, find_clashes, pinned_prompt_count

    where = split_path(snapshot_dir, "train")
    if not where.exists():  # an evaluation-only snapshot: nothing was trained from it
        return
    train = [(str(where), i, record) for i, record in enumerate(load_split(snapshot_dir, "train"))]
    clashes = find_clashes(train, golden_records)
    if clashes:
        raise PinnedSetContamination(clashes, pinned_prompt_count(golden_records))


def rl_start_model(
    rl_start_dir: str | Path | None, reference_dir: str | Path, reference: Any, dtype: Any, device: Any = None
) -> Any | None:
    """The model the RL stage started from: the loaded reference when it is the same folder."""
    from alignflow.models import load_causal_lm

    if rl_start_dir is None:
        return None
    if Path(rl_start_dir).resolve() == Path(reference_dir).resolve():
        return reference
    return load_causal_lm(rl_start_dir, dtype, merge_lora=True, device=device)[0]


def evaluate_paths(
    snapshot_dir: str | Path,
    policy_dir: str | Path | None,
    reference_dir: str | Path | None,
    reward_dir: str | Path | None,
    champion_dir: str | Path | None = None,
    config: EvaluationConfig | None = None,
    golden_path: str | Path | None = None,
    champion_reward_dir: str | Path | None = None,
    dtype: Any = None,
    rl_start_dir: str | Path | None = None,
    device: Any = None,
) -> EvalReport:
    """The pipeline's evaluation in one call: models by path; the snapshot's eval split and,
    when ``golden_path`` is given, the pinned set, side by side (``eval/…`` and ``golden/…``).
    ``dtype`` loads every policy in it (the run's ``model.dtype``), so policy, reference and
    champion generate alike; None keeps each model's saved dtype. A LoRA folder loads with its
    adapters folded into its weights: the same answers, decoded at the base model's speed.
    ``rl_start_dir``: the model the RL stage started from, judged on the pinned set beside the
    reference (the reference itself when it is the same folder). ``device``: where every model
    runs (default: the GPU when there is one, else the CPU)."""
    from alignflow.data.snapshot import load_split
    from alignflow.evaluation.golden import load_golden_records
    from alignflow.models import load_causal_lm
    from alignflow.models.factory import inference_device
    from alignflow.models.reward_scorer import load_reward_scorer

    config = config or EvaluationConfig()
    device = device or inference_device()
    complete = RememberedAnswers(config)  # the eval split and the pinned set share prompts
    records = load_split(snapshot_dir, "eval")
    # each text is scored once: the metrics below ask for the same texts several times
    scorer = load_reward_scorer(reward_dir, device=device, remember=True) if reward_dir is not None else None
    champion_scorer = (
        load_reward_scorer(champion_reward_dir, device=device, remember=True)
        if champion_reward_dir is not None
        else None
    )
    report = EvalReport(info={"snapshot": str(snapshot_dir)})
    if scorer is not None:
        report = report.merge(evaluate_reward_on_held_out(scorer, records, config))
    policy: tuple[Any, Any] | None = None  # (model, tokenizer), as load_causal_lm gives them
    champion: tuple[Any, Any] | None = None
    reference: Any = None
    rl_start: Any = None
    if policy_dir is not None:
        if reference_dir is None:
            raise ValueError("evaluating a policy needs its reference model directory")
        model, tokenizer = policy = load_causal_lm(policy_dir, dtype, merge_lora=True, device=device)
        reference, _ = load_causal_lm(reference_dir, dtype, merge_lora=True, device=device)
        champion = (
            load_causal_lm(champion_dir, dtype, merge_lora=True, device=device)
            if champion_dir is not None
            else None
        )
        rl_start = rl_start_model(rl_start_dir, reference_dir, reference, dtype, device)
        report = report.merge(
            evaluate_policy(model, tokenizer, reference, records, scorer, champion, config, complete)
        )
    if golden_path is not None:
        golden_records = load_golden_records(golden_path)
        refuse_trained_on(snapshot_dir, golden_records)
        report.samples = []  # the pinned set's samples carry the judges' verdicts: show those
        report = report.merge(
            evaluate_on_golden(
                golden_records,
                policy,
                reference,
                scorer,
                champion,
                champion_scorer,
                config,
                rl_start,
                complete,
            )
        )
    return report
