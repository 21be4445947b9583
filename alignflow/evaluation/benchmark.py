"""Evaluating any model on any benchmark file: what ``alignflow eval reward|policy`` runs.

A benchmark file is read and validated by the data stage's own readers and checks, so a
bad row is quarantined with its reason, file and row instead of crashing the evaluation;
only valid rows are scored. On pairs, the report adds what one accuracy hides: how the
reward model does when the chosen answer is the longer one vs the shorter one (length
bias), the rank correlation of reward with length, and the same figures per subset.

With a registered model (``models:/NAME@ALIAS``) and tracking configured, the figures are
logged to an evaluation run against the version's logged model (MLflow 3), so the
registry shows how each version did on each benchmark.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from alignflow.data.checks import as_text, near_key_text
from alignflow.data.config import DataConfig
from alignflow.data.issues import Issue
from alignflow.data.pairing import pairs_from_ranked, pairs_from_scored
from alignflow.data.readers import read_rows
from alignflow.data.schema import RecordKind
from alignflow.data.split import prompt_key
from alignflow.data.validation import (
    Entry,
    describe_inputs,
    load_tokenizer,
    validate_paths,
    validate_rows,
)
from alignflow.evaluation.calibration import pairwise_report
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.intervals import Estimate, is_bound_key, put_estimate, wilson, wilson_of
from alignflow.evaluation.judges import Judge, Scorer
from alignflow.evaluation.metrics import completion_lengths, mean
from alignflow.models.prompting import completion_text

MISSING_SUBSET = "(missing)"
LENGTH_UNIT = "characters"  # model-independent: two models' tokenizers would count differently


# --- reading ---------------------------------------------------------------------------


@dataclass
class Benchmark:
    """The valid rows of a benchmark file (with file and row) and the quarantined ones."""

    name: str
    path: str
    entries: list[Entry]
    issues: list[Issue]
    validation: dict[str, Any]
    max_rows: int | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        return [entry.record for entry in self.entries]

    def pairs(self) -> list[dict[str, Any]]:
        """The labelled pairs, then those of ranked rows and of scored responses to one prompt."""
        return [*self.labelled_pairs(), *self.ranked_pairs(), *self.formed_pairs()]

    def labelled_pairs(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == RecordKind.PAIR]

    def ranked_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == RecordKind.RANKED]

    def ranked_pairs(self) -> list[dict[str, Any]]:
        """Pairs within each ranked row (RewardBench 2, RM-Bench): higher score chosen."""
        return pairs_from_ranked(self.ranked_rows())

    def formed_pairs(self) -> list[dict[str, Any]]:
        """Pairs of scored responses to one prompt (HelpSteer2-style files: the higher score is
        chosen, equal scores form no pair)."""
        return pairs_from_scored(self.scored_responses())

    def scored_responses(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == RecordKind.SCORED]

    def rows(self, scored: int) -> dict[str, Any]:
        """Where every row read went: scored, valid but not scorable here, or quarantined."""
        report = self.validation
        return {
            "read": report["input_rows"],
            "valid": report["kept"],
            "scored": scored,
            "valid_not_scored": report["kept"] - scored,
            "kinds": report["kinds"],
            "quarantined": report["quarantined"],
            "quarantined_by_reason": report["counts_by_reason"],
            "quarantined_rows": [issue.to_dict() for issue in self.issues],
            "unreadable_files": report["unreadable_files"],
            "truncated_files": report["truncated_files"],
        }


def benchmark_name(path: str | Path) -> str:
    """The file name without any suffix: ``hh-test.jsonl.gz`` -> ``hh-test``."""
    return Path(path).name.split(".")[0] or Path(path).name


def read_benchmark(
    path: str | Path,
    config: DataConfig | None = None,
    max_rows: int | None = None,
    fmt: str | None = None,
    name: str | None = None,
) -> Benchmark:
    """Read and validate a benchmark file (or directory) as the data stage would.

    ``max_rows`` stops reading after that many input rows, so a quick look at a large file
    costs seconds. A :class:`~alignflow.data.readers.FormatError` (unknown format) is
    raised; everything else wrong with the input ends up in ``issues``.
    """
    config = config or DataConfig()
    path = Path(path)
    fmt = fmt or config.format
    if max_rows is None:
        validated = validate_paths(path, config, fmt)
    else:
        rows = itertools.islice(read_rows(path, fmt, hint_splits=path.is_dir()), max_rows)
        validated = validate_rows(rows, config, describe_inputs([path], fmt), load_tokenizer(config))
    return Benchmark(
        name or benchmark_name(path),
        str(path),
        validated.kept,
        validated.issues,
        validated.report,
        max_rows,
    )


def benchmark_info(benchmark: Benchmark) -> dict[str, Any]:
    inputs = benchmark.validation.get("inputs") or [{}]
    return {
        "name": benchmark.name,
        "path": benchmark.path,
        "sha256": inputs[0].get("sha256") if len(inputs) == 1 else None,
        "max_rows": benchmark.max_rows,
    }


# --- reward models on pairs ------------------------------------------------------------


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (ties share their mean rank); None when a side is constant."""
    import pandas as pd

    if len(x) != len(y):
        raise ValueError(f"spearman needs paired values: {len(x)} vs {len(y)}")
    rx, ry = pd.Series(x, dtype=float).rank(), pd.Series(y, dtype=float).rank()
    if len(rx) < 2 or rx.nunique() < 2 or ry.nunique() < 2:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclass(frozen=True)
class LengthBias:
    """Does the reward model prefer length rather than quality?

    A reward model that has learnt "longer is better" is right on pairs whose chosen side is
    longer and wrong on the others; its overall accuracy hides this when most chosen
    answers happen to be longer. ``gap`` is |accuracy when longer - accuracy when shorter|.
    """

    chosen_longer: Estimate
    chosen_shorter: Estimate
    equal_length: int
    gap: float | None
    spearman_reward_length: float | None
    responses: int
    unit: str = LENGTH_UNIT

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "chosen_longer": self.chosen_longer.as_dict(),
            "chosen_shorter": self.chosen_shorter.as_dict(),
        }


def length_bias(
    chosen: Sequence[float],
    rejected: Sequence[float],
    chosen_lengths: Sequence[int],
    rejected_lengths: Sequence[int],
) -> LengthBias:
    """Accuracy split by which side is longer, and reward-length correlation over all responses."""
    longer: list[float] = []
    shorter: list[float] = []
    equal = 0
    for c, r, lc, lr in zip(chosen, rejected, chosen_lengths, rejected_lengths, strict=True):
        if lc == lr:
            equal += 1
        else:
            (longer if lc > lr else shorter).append(1.0 if c > r else 0.0)
    when_longer, when_shorter = wilson_of(longer), wilson_of(shorter)
    gap = (
        abs(when_longer.value - when_shorter.value)
        if when_longer.value is not None and when_shorter.value is not None
        else None
    )
    rewards = [*chosen, *rejected]
    return LengthBias(
        when_longer,
        when_shorter,
        equal,
        gap,
        spearman(rewards, [*chosen_lengths, *rejected_lengths]),
        len(rewards),
    )


@dataclass
class ScoredPairs:
    """A reward model's scores of each pair's two sides, and the sides' lengths."""

    chosen: list[float]
    rejected: list[float]
    chosen_lengths: list[int]
    rejected_lengths: list[int]

    def subset(self, index: Sequence[int]) -> ScoredPairs:
        return ScoredPairs(
            [self.chosen[i] for i in index],
            [self.rejected[i] for i in index],
            [self.chosen_lengths[i] for i in index],
            [self.rejected_lengths[i] for i in index],
        )


def raw_scorer(scorer: Scorer) -> Scorer:
    """A scorer's un-normalised ``raw`` when it has one: calibration reads the real margins."""
    return getattr(scorer, "raw", scorer)


class ScoreOnce:
    """A scorer's raw rewards, each distinct (prompt, response) scored once per evaluation: a
    response sits in several formed pairs, and again in the correlation and best-of-n figures."""

    def __init__(self, scorer: Scorer):
        self.scorer = raw_scorer(scorer)
        self.rewards: dict[tuple[str, str], float] = {}

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str]) -> list[float]:
        keys = [(prompt_key(p), c) for p, c in zip(prompts, completions, strict=True)]
        new: dict[tuple[str, str], int] = {}
        for i, key in enumerate(keys):
            if key not in self.rewards:
                new.setdefault(key, i)
        if new:
            scored = self.scorer([prompts[i] for i in new.values()], [completions[i] for i in new.values()])
            self.rewards.update(zip(new, scored, strict=True))
        return [self.rewards[key] for key in keys]


def score_benchmark_pairs(score: ScoreOnce, pairs: Sequence[Mapping[str, Any]]) -> ScoredPairs:
    """Raw scores and the lengths in characters of every chosen and rejected response."""
    chosen = [completion_text(p["chosen"]) for p in pairs]
    rejected = [completion_text(p["rejected"]) for p in pairs]
    prompts = [p["prompt"] for p in pairs]
    rewards = score([*prompts, *prompts], [*chosen, *rejected])
    return ScoredPairs(
        rewards[: len(pairs)],
        rewards[len(pairs) :],
        completion_lengths(chosen),
        completion_lengths(rejected),
    )


def scored_response_figures(
    score: ScoreOnce, responses: Sequence[Mapping[str, Any]], formed: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """How a reward model's scores of scored responses follow their scores: the Spearman rank
    correlation over all of them, and how many sat in a formed pair."""
    texts = [completion_text(r["completion"]) for r in responses]
    rewards = score([r["prompt"] for r in responses], texts)
    sides = ((p["prompt"], side) for p in formed for side in (p["chosen"], p["rejected"]))
    in_pairs = {(prompt_key(prompt), completion_text(side)) for prompt, side in sides}
    paired = sum((prompt_key(r["prompt"]), t) in in_pairs for r, t in zip(responses, texts, strict=True))
    return {
        "responses": len(responses),
        "paired": paired,
        "pairs": len(formed),
        "spearman_reward_score": spearman(rewards, [r["score"] for r in responses]),
    }


def best_of_n(score: ScoreOnce, rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per ranked row, 1.0 when the response the reward model scores highest is one of the
    row's best (RewardBench 2's accuracy: the chosen answer beats every rejected one). A tie
    with a worse response, or a reward that is not finite, counts as wrong."""
    prompts = [r["prompt"] for r in rows for _ in r["responses"]]
    rewards = iter(score(prompts, [completion_text(x) for r in rows for x in r["responses"]]))
    outcomes = []
    for row in rows:
        mine = [next(rewards) for _ in row["responses"]]
        top = max(row["scores"])
        best = max(x for x, s in zip(mine, row["scores"], strict=True) if s == top)
        rest = max(x for x, s in zip(mine, row["scores"], strict=True) if s != top)
        outcomes.append(1.0 if all(map(math.isfinite, mine)) and best > rest else 0.0)
    return outcomes


def ranked_figures(score: ScoreOnce, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Ranked rows as a whole: how often the reward model's favourite is a best response."""
    return {
        "rows": len(rows),
        "responses": sum(len(r["responses"]) for r in rows),
        "best_of_n_accuracy": wilson_of(best_of_n(score, rows)).as_dict(),
    }


def pair_figures(scored: ScoredPairs) -> dict[str, Any]:
    """Accuracy with its Wilson interval, ECE, margin and reward statistics of some pairs."""
    calibration = pairwise_report(scored.chosen, scored.rejected)
    right = sum(c > r for c, r in zip(scored.chosen, scored.rejected, strict=True))
    return {
        "pairs": calibration.n_pairs,
        "tied_pairs": sum(c == r for c, r in zip(scored.chosen, scored.rejected, strict=True)),
        "nonfinite_rewards": sum(not math.isfinite(x) for x in [*scored.chosen, *scored.rejected]),
        "accuracy": wilson(right, calibration.n_pairs).as_dict(),
        "ece": calibration.ece,
        "margin_mean": calibration.margin_mean,
        "reward_mean": calibration.reward_mean,
        "reward_std": calibration.reward_std,
    }


def subset_value(record: Mapping[str, Any], column: str) -> str:
    """A row's subset: a canonical field, else the input column kept in ``metadata``."""
    value = record.get(column)
    if value is None:
        value = (record.get("metadata") or {}).get(column)
    return MISSING_SUBSET if value is None else str(value)


def subset_table(
    pairs: Sequence[Mapping[str, Any]],
    scored: ScoredPairs,
    column: str,
    ranked: Sequence[Mapping[str, Any]] = (),
    score: ScoreOnce | None = None,
) -> dict[str, dict[str, Any]]:
    """Per subset value (sorted): the pair figures and the length bias of its rows, and the
    best-of-n accuracy of its ranked rows where it has some."""
    groups: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        groups.setdefault(subset_value(pair, column), []).append(i)
    rows_by_value: dict[str, list[Mapping[str, Any]]] = {}
    for row in ranked:
        rows_by_value.setdefault(subset_value(row, column), []).append(row)
    table = {}
    for value, index in sorted(groups.items()):
        part = scored.subset(index)
        bias = length_bias(part.chosen, part.rejected, part.chosen_lengths, part.rejected_lengths)
        table[value] = {**pair_figures(part), "length_gap": bias.gap}
        if value in rows_by_value and score is not None:
            table[value]["best_of_n_accuracy"] = wilson_of(best_of_n(score, rows_by_value[value])).as_dict()
    return table


def evaluate_reward_benchmark(
    scorer: Scorer, benchmark: Benchmark, subset_column: str | None = None
) -> dict[str, Any]:
    """The ``eval reward`` report: rows, accuracy (95% interval), ECE, margin, length bias
    and, with ``subset_column``, the same per subset. Raises ValueError with no pair to score."""
    labelled, ranked, formed = benchmark.labelled_pairs(), benchmark.ranked_rows(), benchmark.formed_pairs()
    within_ranked = pairs_from_ranked(ranked)
    pairs = [*labelled, *within_ranked, *formed]
    if not pairs:
        raise ValueError(
            f"{benchmark.path}: no valid pair rows to score ({benchmark.validation['input_rows']} read, "
            f"{benchmark.validation['quarantined']} quarantined, kinds {benchmark.validation['kinds']})"
        )
    score = ScoreOnce(scorer)
    scored = score_benchmark_pairs(score, pairs)
    bias = length_bias(scored.chosen, scored.rejected, scored.chosen_lengths, scored.rejected_lengths)
    responses = benchmark.scored_responses()
    from_scores = scored_response_figures(score, responses, formed) if responses else None
    from_ranks = ranked_figures(score, ranked) if ranked else None
    rows_scored = len(labelled) + len(ranked) + (from_scores["paired"] if from_scores else 0)
    report: dict[str, Any] = {
        "kind": "reward",
        "benchmark": benchmark_info(benchmark),
        "rows": benchmark.rows(rows_scored),
        **pair_figures(scored),
        "length_bias": bias.as_dict(),
        "scored_responses": from_scores,
        "ranked": from_ranks,
        "subsets": None,
        "notes": [],
    }
    if report["tied_pairs"]:
        report["notes"].append(
            f"{report['tied_pairs']} of {len(pairs)} pairs got the same reward for both responses: they "
            "count as wrong (a model whose rewards do not tell responses apart scores 0, not 0.5)"
        )
    if from_ranks:
        report["notes"].append(
            f"{len(within_ranked)} pairs from {from_ranks['rows']} ranked rows ({from_ranks['responses']} "
            "responses; every response pairs with each one ranked below it); best_of_n_accuracy counts a "
            "row right when the reward model's favourite is one of its best"
        )
    if from_scores:
        report["notes"].append(
            f"{from_scores['pairs']} pairs formed from {from_scores['paired']} of {from_scores['responses']} "
            "scored responses (per prompt, the higher score is chosen; equal scores and a prompt's only "
            "response form none)"
        )
    if report["nonfinite_rewards"]:
        report["notes"].append(
            f"{report['nonfinite_rewards']} of {2 * len(pairs)} rewards are not finite (NaN/inf): "
            "their pairs count as wrong and ECE cannot be measured"
        )
    if subset_column:
        groups = subset_table(pairs, scored, subset_column, ranked, score)
        report["subsets"] = {"column": subset_column, "groups": groups}
        if set(groups) == {MISSING_SUBSET}:
            report["notes"].append(f"no scored row has a value in column {subset_column!r}")
    report["metrics"] = reward_metrics(report)
    return report


def _estimate(metrics: dict[str, float | None], key: str, estimate: Mapping[str, Any]) -> None:
    put_estimate(metrics, key, Estimate(**estimate))


# report field -> metric name, named as the evaluation stage names them (eval/reward_margin ...)
_FLAT_NAMES = {
    "ece": "reward_ece",
    "margin_mean": "reward_margin",
    "reward_mean": "reward_mean",
    "reward_std": "reward_std",
}


def reward_metrics(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The report's figures as flat metric names (what MLflow records)."""
    metrics: dict[str, float | None] = {}
    _estimate(metrics, "reward_accuracy", report["accuracy"])
    metrics |= {name: report[k] for k, name in _FLAT_NAMES.items()}
    bias = report["length_bias"]
    _estimate(metrics, "length_bias/accuracy_chosen_longer", bias["chosen_longer"])
    _estimate(metrics, "length_bias/accuracy_chosen_shorter", bias["chosen_shorter"])
    metrics["length_bias/gap"] = bias["gap"]
    metrics["length_bias/spearman_reward_length"] = bias["spearman_reward_length"]
    metrics |= _row_metrics(report["rows"])
    if report.get("scored_responses"):
        metrics["scored/spearman_reward_score"] = report["scored_responses"]["spearman_reward_score"]
    if report.get("ranked"):
        _estimate(metrics, "ranked/best_of_n_accuracy", report["ranked"]["best_of_n_accuracy"])
    for value, figures in ((report.get("subsets") or {}).get("groups") or {}).items():
        _estimate(metrics, f"subset/{value}/reward_accuracy", figures["accuracy"])
        if "best_of_n_accuracy" in figures:
            _estimate(metrics, f"subset/{value}/best_of_n_accuracy", figures["best_of_n_accuracy"])
    return metrics


def _row_metrics(rows: Mapping[str, Any]) -> dict[str, float]:
    return {f"rows/{k}": float(rows[k]) for k in ("read", "scored", "quarantined")}


# --- policies on prompts -----------------------------------------------------------------


# GSM8K and its kin end a worked solution (reference or completion) with "#### <answer>"
_FINAL_ANSWER = re.compile(r"(?:^|\n)####[ \t]*([^\n]+?)\s*\Z")
_STATED_NUMBER = (re.compile(r"The answer is (-?[\d,]+)\."), re.compile(r"####\s*(-?[\d,]+)"))
_INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+|-?\d+")


def reference_answer(answer: Any) -> Any:
    """The answer a reference states: its closing ``#### X`` line's X (GSM8K), else all of it.

    Only a closing line counts, so a Markdown heading inside a text answer is not taken for it.
    """
    if isinstance(answer, str):
        final = _FINAL_ANSWER.search(answer)
        if final:
            return final.group(1)
    return answer


def stated_number(completion: str) -> int | None:
    """The integer a completion states as its answer: ``The answer is N.`` (the demo task's
    required format), else a GSM8K-style ``#### N``; None when it states none."""
    for pattern in _STATED_NUMBER:
        found = pattern.search(completion)
        if found and _INTEGER.fullmatch(found.group(1)):
            return int(found.group(1).replace(",", ""))
    return None


def answer_score(completion: str, answer: Any) -> float:
    """1.0 when a completion gets a reference answer right.

    An integer answer (``7``, ``"1,234"``, or a GSM8K solution ending ``#### 7``) must be the
    number the completion states in a required format (``The answer is 7.`` or ``#### 7``):
    a number merely mentioned does not count. Any other answer counts when its words appear
    in the completion (case, spacing and punctuation folded), so a prompt file with text
    answers can be judged too.
    """
    answer = reference_answer(answer)
    if isinstance(answer, bool):
        answer = str(answer)
    if isinstance(answer, int) or _INTEGER.fullmatch(str(answer).strip()):
        stated = stated_number(completion)
        return 1.0 if stated is not None and stated == int(str(answer).strip().replace(",", "")) else 0.0
    wanted = near_key_text(str(answer))
    return 1.0 if wanted and f" {wanted} " in f" {near_key_text(completion)} " else 0.0


def prompt_rows(benchmark: Benchmark, limit: int) -> tuple[list[Any], list[Any]]:
    """Distinct prompts of the valid rows (any kind carries one) and their answers or None."""
    from alignflow.evaluation.challenger import golden_prompts

    return golden_prompts(benchmark.records, limit)


def same_vocabulary(a: Any, b: Any) -> bool:
    """KL between two policies is defined token by token: only over one shared vocabulary."""
    return a.get_vocab() == b.get_vocab()


@dataclass
class PolicyRun:
    """What ``eval policy`` compared: the policy, an optional opponent, judges and a scorer."""

    policy: tuple[Any, Any]
    against: tuple[Any, Any] | None = None
    judges: Mapping[str, Judge] = field(default_factory=dict)
    scorer: Scorer | None = None
    config: EvaluationConfig = field(default_factory=EvaluationConfig)


def _against_figures(
    run: PolicyRun, prompts: list[Any], answers: list[Any], ours: list[str], notes: list[str]
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """Policy vs --against: the pinned-set comparison (every figure with its interval),
    named for this command, and KL where the two models share a vocabulary."""
    from alignflow.evaluation.challenger import judge_policy_completions
    from alignflow.evaluation.evaluate import generate_answers
    from alignflow.evaluation.kl import sampled_kl
    from alignflow.evaluation.metric_names import golden_key

    config = run.config
    assert run.against is not None  # the caller runs this only with an opponent
    theirs = generate_answers(*run.against, prompts, config)
    judged = judge_policy_completions(
        prompts, answers, ours, theirs, None, run.judges, None, answer_score, config.seed
    )

    def renamed(key: str) -> str:
        return key.removeprefix(golden_key("")).replace("reference", "against")

    metrics = {renamed(k): v for k, v in judged.metrics.items()}
    samples = [{renamed(k): v for k, v in row.items()} for row in judged.samples[: config.num_samples]]
    metrics["against_length_mean"] = mean(completion_lengths(theirs))
    if not config.kl_samples:
        notes.append("KL skipped: evaluation.kl_samples is 0")
    elif not same_vocabulary(run.policy[1], run.against[1]):
        notes.append("KL skipped: the policy and --against use different vocabularies")
    else:
        kl_prompts = [prompts[i % len(prompts)] for i in range(config.kl_samples)]
        model, tokenizer = run.policy
        metrics["kl_to_against"] = sampled_kl(
            model,
            run.against[0],
            tokenizer,
            kl_prompts,
            config.max_new_tokens,
            config.batch_size,
            config.seed,
        )
    return metrics, samples


def _alone_figures(
    prompts: list[Any], answers: list[Any], ours: list[str], limit: int
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """A policy with no opponent: task accuracy (with its interval) on the answered prompts."""
    metrics: dict[str, float | None] = {"answers": float(sum(a is not None for a in answers))}
    outcomes = [None if a is None else answer_score(c, a) for c, a in zip(ours, answers, strict=True)]
    put_estimate(metrics, "task_accuracy", wilson_of(outcomes))
    samples = [
        {"prompt": as_text(p), "policy": c} | ({"answer": a} if a is not None else {})
        for p, c, a in zip(prompts, ours, answers, strict=True)
    ]
    return metrics, samples[:limit]


def cut_prompts_note(
    role: str, model: Any, tokenizer: Any, prompts: list[Any], max_new_tokens: int
) -> list[str]:
    """A note when a model's position table made generation cut prompts from the left (see
    :func:`~alignflow.models.prompting.prompt_batch`): its answers saw only their ends."""
    from alignflow.models.positions import prompt_token_budget
    from alignflow.models.prompting import prompts_cut

    budget = prompt_token_budget(tokenizer, max_new_tokens, model)
    n = prompts_cut(tokenizer, prompts, budget)
    if not n or budget is None:  # without a budget (no position table) nothing is cut: n is 0
        return []
    return [
        f"{n} of {len(prompts)} prompts were longer than the {role} reads ({budget + max_new_tokens} "
        f"positions less max_new_tokens {max_new_tokens}): each was cut to its last {budget} tokens"
    ]


def evaluate_policy_benchmark(run: PolicyRun, benchmark: Benchmark) -> dict[str, Any]:
    """The ``eval policy`` report: the policy answers every distinct prompt (and the opponent
    too, with ``against``); win rates per judge and task accuracy with 95% intervals,
    length and, when both share a vocabulary, KL(policy || against)."""
    from alignflow.evaluation.evaluate import generate_answers

    config = run.config
    prompts, answers = prompt_rows(benchmark, config.max_prompts)
    if not prompts:
        raise ValueError(f"{benchmark.path}: no valid rows with a prompt to answer")
    ours = generate_answers(*run.policy, prompts, config)
    notes: list[str] = []
    for role, pair in (("policy", run.policy), ("--against model", run.against)):
        if pair is not None:
            notes += cut_prompts_note(role, *pair, prompts, config.max_new_tokens)
    if run.against is not None:
        metrics, samples = _against_figures(run, prompts, answers, ours, notes)
    else:
        metrics, samples = _alone_figures(prompts, answers, ours, config.num_samples)
        notes.append("no --against model: no win rates, no KL")
    metrics["length_mean"] = mean(completion_lengths(ours))
    if run.scorer is not None:
        metrics["reward_mean"] = mean(getattr(run.scorer, "raw", run.scorer)(prompts, ours))
    rows = benchmark.rows(len(prompts))
    return {
        "kind": "policy",
        "benchmark": benchmark_info(benchmark),
        "rows": rows,
        "judges": sorted(run.judges),
        "length_unit": LENGTH_UNIT,
        "metrics": metrics | _row_metrics(rows),
        "notes": notes,
        "samples": samples,
    }


# --- the report files ----------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", "⏎")


def _metric_rows(metrics: Mapping[str, float | None]) -> list[str]:
    lines = ["| metric | value | 95% interval | n |", "|---|---|---|---|"]
    for key in sorted(k for k in metrics if not is_bound_key(k)):
        low, high, n = (metrics.get(f"{key}/{s}") for s in ("low", "high", "n"))
        interval = f"[{_cell(low)}, {_cell(high)}]" if low is not None else ""
        lines.append(f"| `{key}` | {_cell(metrics[key])} | {interval} | {'' if n is None else int(n)} |")
    return lines


def _value_and_interval(estimate: Mapping[str, Any] | None) -> list[Any]:
    if estimate is None:
        return [None, ""]
    return [estimate["value"], f"[{_cell(estimate['low'])}, {_cell(estimate['high'])}]"]


def _quarantine_row(q: Mapping[str, Any]) -> str:
    where = f"{q['file']}:{q['row']}" if q["row"] is not None else q["file"]
    return f"| {_cell(where)} | {_cell(q['field'])} | `{q['code']}` | {_cell(q['message'])} |"


def to_markdown(report: Mapping[str, Any]) -> str:
    """The report for people: rows and quarantine reasons, figures with intervals, subsets."""
    bench, rows = report["benchmark"], report["rows"]
    lines = [f"# {report['kind'].capitalize()} evaluation on `{bench['name']}`", ""]
    lines += [f"- **{k}**: {_cell(v)}" for k, v in bench.items()]
    if report.get("model"):
        lines += [f"- **model**: {_cell(report['model'].get('ref'))}"]
    if report.get("against"):
        lines += [f"- **against**: {_cell(report['against'].get('ref'))}"]
    lines += [f"- **note**: {_cell(note)}" for note in report.get("notes") or []]
    lines += ["", "## Rows", ""]
    lines += [f"- {k}: {rows[k]}" for k in ("read", "valid", "scored", "valid_not_scored", "quarantined")]
    if rows["quarantined_by_reason"]:
        lines += ["", "| reason | rows |", "|---|---|"]
        lines += [f"| `{k}` | {v} |" for k, v in rows["quarantined_by_reason"].items()]
        lines += ["", "| file:row | field | reason | message |", "|---|---|---|---|"]
        lines += [_quarantine_row(q) for q in rows["quarantined_rows"]]
    lines += ["", "## Metrics", "", *_metric_rows(report["metrics"])]
    subsets = report.get("subsets")
    if subsets:
        lines += ["", f"## By `{subsets['column']}`", ""]
        ranked = any("best_of_n_accuracy" in g for g in subsets["groups"].values())
        lines += [
            "| subset | pairs | accuracy | 95% interval | ECE | margin | length gap |"
            + (" best of n | 95% interval |" if ranked else ""),
            "|---|---|---|---|---|---|---|" + ("---|---|" if ranked else ""),
        ]
        for value, g in subsets["groups"].items():
            cells = [value, g["pairs"], *_value_and_interval(g["accuracy"])]
            cells += [g["ece"], g["margin_mean"], g["length_gap"]]
            if ranked:
                cells += _value_and_interval(g.get("best_of_n_accuracy"))
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if report.get("samples"):
        columns = list(report["samples"][0])
        lines += ["", "## Samples", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(s.get(c)) for c in columns) + " |" for s in report["samples"]]
    return "\n".join(lines) + "\n"


def write_benchmark_report(report: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """``report.json`` and ``report.md`` under ``out_dir``."""
    import json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "markdown": out_dir / "report.md"}
    paths["json"].write_text(json.dumps(report, indent=2, sort_keys=True, default=str), encoding="utf-8")
    paths["markdown"].write_text(to_markdown(report), encoding="utf-8")
    return paths
