"""Do the new labels agree with a judge that has been shown competent on pairs like them?

A data version whose chosen and rejected sides were swapped (by mistake or on purpose)
passes every row check: the rows are well formed, only their labels lie. This check judges
the labels before anything is versioned, and it stops the run for one of two reasons:

- ``label_disagreement``: a judge that can judge these pairs contradicts their labels;
- ``cannot_judge``: some pairs have no judge that can judge them (a scheduled run must not
  train on them); the way on is to add answers, or to accept them with a recorded reason
  (``alignflow data add --accept-unjudged "why"``), which every model trained on them shows.

Judges, in order:

1. **Verifiers first.** A pair whose reference answer is known (its ``metadata.answer``, else
   a registered task verifier that computes it from the prompt,
   :mod:`alignflow.data.verifiers`) and where exactly one side states it is judged by that
   answer alone (:func:`check_answer_labels`). Honest labels never contradict it.
2. **The champion reward model, audited.** On exactly those verified pairs the champion
   reward model is audited against the verifier; a judge that demonstrably disagrees with it
   (the upper bound of its agreement below the threshold) does not count anywhere in the run.
3. **Only where it is competent.** A pair the verifier cannot decide is judged by the reward
   model only where the model has been shown competent on held-out pairs of the same kind
   (the pinned set's pairs: the same response format on each side, similar length, the same
   distance between the sides, :class:`PairKind`): the lower bound of its accuracy on at least
   ``min_matched`` of them must clear the threshold. Elsewhere the verdict is "cannot judge",
   never "disagrees": a model trained on tier pairs (formatted vs sloppy) has not been shown to
   tell a right answer from an off-by-one one in the same format.

A judge's threshold is its pinned-set accuracy less ``data.label_check_max_gap`` (the verifier:
1.0 less the gap). Labels are refused when even the upper bound of the judge's agreement with
them falls below it, overall or on a slice of the new pairs (:mod:`alignflow.evaluation.slices`:
each problem across phrasings, each phrasing, a declared slice) with ``min_slice_pairs`` pairs
or more: a narrow backdoor (wrong answers chosen on two problems out of a hundred) hides in the
overall figure but not in its slices, and the check names them.
"""

from __future__ import annotations

import difflib
import json
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from alignflow.data.checks import RECORD_WHERE as WHERE
from alignflow.data.checks import as_text
from alignflow.errors import CannotJudge, DataCheckStop
from alignflow.evaluation.intervals import Estimate, wilson
from alignflow.evaluation.slices import DEFAULT_SLICE_FIELDS, group_items

LABEL_DISAGREEMENT = "label_disagreement"
CANNOT_JUDGE = CannotJudge.reason
PASSED = "passed"
CHAMPION_JUDGE = "the champion reward model"
ANSWERS_JUDGE = "the verifiable answers (metadata.answer, else the task's verifier)"
MIN_SLICE_PAIRS = 8  # fewer pairs in a slice are not judged on their own (they count overall)
MIN_MATCHED_PAIRS = 10  # held-out pairs of a kind the model must be right on before it judges it
ACCEPT_OPTION = "--accept-unjudged"
WAYS_ON = (
    "add each row's right answer as metadata.answer (the answers then judge it), or version it "
    f'anyway with `alignflow data add PATH {ACCEPT_OPTION} "why these labels can be trusted"` (the '
    "reason is recorded on the data version and shown on every model version trained on it)"
)
Scorer = Callable[[Sequence[Any], Sequence[Any]], list[float]]


@dataclass(frozen=True)
class LabelCheck:
    """A judge's agreement with the new labels (or, auditing a model judge, with the verifiable
    answers), and whether it is too low: the upper bound below its accuracy less the gap."""

    agreement: Estimate
    champion_accuracy: float
    max_gap: float
    examples: list[dict[str, Any]] = field(default_factory=list)
    slices: dict[str, Estimate] = field(default_factory=dict)  # agreement per judged slice
    judge: str = CHAMPION_JUDGE
    subject: str = "the new pairs' labels"

    @property
    def threshold(self) -> float:
        return self.champion_accuracy - self.max_gap

    def _below(self, estimate: Estimate) -> bool:
        return estimate.high is not None and estimate.high < self.threshold

    @property
    def broken_slices(self) -> dict[str, Estimate]:
        """Slices whose labels the champion contradicts, even where the overall figure passes."""
        return {name: e for name, e in self.slices.items() if self._below(e)}

    @property
    def passed(self) -> bool:
        return not self._below(self.agreement) and not self.broken_slices

    def describe(self) -> str:
        answers = self.judge == ANSWERS_JUDGE
        basis = (
            "where they decide, honest labels always agree"
            if answers
            else f"its pinned-set accuracy is {self.champion_accuracy:.3f}"
        )
        text = (
            f"{self.judge} agree{'' if answers else 's'} with "
            f"{self.agreement.describe()} of {self.subject}; {basis}, so at least "
            f"{self.threshold:.3f} was expected (data.label_check_max_gap={self.max_gap:g})"
        )
        broken = sorted(self.broken_slices.items(), key=lambda item: item[1].high or 0.0)
        if broken:
            shown = "; ".join(f"slice {name}: {e.describe()}" for name, e in broken[:5])
            text += f"; {len(broken)} slice(s) of the new pairs disagree: {shown}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": LABEL_DISAGREEMENT,
            "judge": self.judge,
            "subject": self.subject,
            "passed": self.passed,
            "agreement": self.agreement.as_dict(),
            "champion_accuracy": self.champion_accuracy,
            "max_gap": self.max_gap,
            "threshold": self.threshold,
            "broken_slices": {name: e.as_dict() for name, e in self.broken_slices.items()},
            "slices_judged": len(self.slices),
            "message": self.describe(),
            "examples": self.examples,
        }


class LabelDisagreement(DataCheckStop):
    """A judge that can judge the new pairs contradicts their labels: the run must stop."""

    reason = LABEL_DISAGREEMENT
    report_words = "examples in"

    def __init__(
        self, check: LabelCheck, report_path: str | None = None, verdict: LabelVerdict | None = None
    ):
        super().__init__(check.describe(), report_path)
        self.check = check
        self.verdict = verdict

    @property
    def examples(self) -> list[dict[str, Any]]:
        """The disagreeing pairs, each with where it came from and the judges' scores."""
        return self.check.examples


# ---------------------------------------------------------------- what kind of pair is it?

_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")
FREE_TEXT = "free text"
NEAR_MISS = 2  # answers this close (or closer) apart are a near miss, further ones far off
EDIT_CHARS = 300  # how much of each side the edit distance between them reads


def masked(text: str) -> str:
    """A response's shape: numbers masked, spaces folded, case folded."""
    return _SPACES.sub(" ", _DIGITS.sub("#", text)).strip().casefold()


@dataclass(frozen=True)
class PairKind:
    """What a judge must have been shown competent on before its verdict on a pair counts.

    ``formats``: each side's shape (its text with numbers masked) where other responses share
    it (a template, such as ``the answer is #.``), else ``free text``; sorted, so a pair and its
    flip are of one kind. ``length``: the log2 bucket of the sides' mean length. ``answers``:
    how far apart the numbers both sides commit to are (``same``, ``near-miss``, ``far-off``;
    ``-`` unless both sides follow a template). ``edit``: ``close`` when the sides' texts are
    80% alike, else ``apart``.
    """

    formats: tuple[str, str]
    length: int
    answers: str
    edit: str

    def matches(self, other: PairKind) -> bool:
        """Same formats, answers and edit distance; lengths within a factor of about two."""
        same = (self.formats, self.answers, self.edit) == (other.formats, other.answers, other.edit)
        return same and abs(self.length - other.length) <= 1

    def describe(self) -> str:
        formats = " vs ".join(repr(f) if f != FREE_TEXT else f for f in self.formats)
        answers = "" if self.answers == "-" else f", {self.answers} answers"
        return f"{formats}{answers}, sides {self.edit}, ~{2**self.length}-{2 ** (self.length + 1)} chars"

    def as_dict(self) -> dict[str, Any]:
        return {"formats": list(self.formats), "length_log2": self.length, "answers": self.answers,
                "edit": self.edit, "describe": self.describe()}  # fmt: skip


def pair_kind(chosen: str, rejected: str, templates: set[str]) -> PairKind:
    """The kind of one pair, given the shapes that count as templates."""
    from alignflow.data.answers import extract_answer

    shapes = [masked(t) for t in (chosen, rejected)]
    formats = [shape if shape in templates else FREE_TEXT for shape in shapes]
    answers = "-"
    if FREE_TEXT not in formats:
        said = extract_answer(chosen), extract_answer(rejected)
        if said[0] is not None and said[1] is not None:
            gap = abs(said[0] - said[1])
            answers = "same" if gap == 0 else "near-miss" if gap <= NEAR_MISS else "far-off"
    length = int(math.log2(1 + (len(chosen) + len(rejected)) / 2))
    # the openings decide "alike" (a ratio over whole long transcripts costs quadratic time)
    alike = difflib.SequenceMatcher(None, chosen[:EDIT_CHARS], rejected[:EDIT_CHARS], autojunk=False).ratio()
    return PairKind((min(formats), max(formats)), length, answers, "close" if alike >= 0.8 else "apart")


def templates_of(texts: Sequence[str]) -> set[str]:
    """The shapes two or more different responses share: their format is a template, not free text."""
    counts = Counter(masked(t) for t in set(texts))
    return {shape for shape, n in counts.items() if n >= 2}


@dataclass(frozen=True)
class Competence:
    """A model judge's accuracy on held-out pairs of one kind, and whether it may judge that kind."""

    kind: PairKind
    accuracy: Estimate
    threshold: float
    min_matched: int
    pairs: int = 0  # new pairs of this kind

    @property
    def shown(self) -> bool:
        low = self.accuracy.low
        return self.accuracy.n >= self.min_matched and low is not None and low >= self.threshold

    def describe(self) -> str:
        if self.accuracy.n < self.min_matched:
            seen = (
                f"only {self.accuracy.n} held-out pair(s) like them"
                if self.accuracy.n
                else ("no held-out pair like them")
            )
            return f"{seen} to show competence on (needs {self.min_matched})"
        verdict = "competent" if self.shown else "not shown competent"
        return (
            f"{verdict}: right on {self.accuracy.describe()} held-out pairs like them "
            f"(lower bound needs >= {self.threshold:.3f})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.as_dict(), "accuracy": self.accuracy.as_dict(), "shown": self.shown,
                "new_pairs": self.pairs, "describe": self.describe()}  # fmt: skip


@dataclass(frozen=True)
class ModelJudge:
    """A model judge of labels: its scorer, its pinned-set accuracy, and the held-out labelled
    pairs (the pinned set's) on which its competence on each kind of pair is measured."""

    scorer: Scorer
    accuracy: float
    reference: Sequence[Mapping[str, Any]] = ()
    name: str = CHAMPION_JUDGE


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class LabelVerdict:
    """Every judge's say on the new pairs, and what follows: passed, disagreement or cannot judge."""

    pairs: int  # the new pairs looked at
    verifier: LabelCheck | None = None  # the answers against the labels, where they decide
    audit: LabelCheck | None = None  # the model judge against the answers, on the same pairs
    model: LabelCheck | None = None  # the model judge against the labels, where it is competent
    competence: list[Competence] = field(default_factory=list)
    unjudged: int = 0
    unjudged_examples: list[dict[str, Any]] = field(default_factory=list)
    unjudged_reasons: dict[str, int] = field(default_factory=dict)
    model_judge: str | None = None  # the model judge's name; None when there was none to ask

    @property
    def judge_discredited(self) -> bool:
        """The model judge failed its audit against the verifier: it counts nowhere in this run."""
        return self.audit is not None and not self.audit.passed

    @property
    def disagreeing(self) -> LabelCheck | None:
        for check in (self.verifier, self.model):
            if check is not None and not check.passed:
                return check
        return None

    @property
    def status(self) -> str:
        if self.disagreeing is not None:
            return LABEL_DISAGREEMENT
        if self.unjudged and self.model_judge is not None:
            return CANNOT_JUDGE
        return PASSED

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def describe_unjudged(self) -> str:
        reasons = "; ".join(f"{n} pair(s): {why}" for why, n in self.unjudged_reasons.items())
        return (
            f"{self.unjudged} of {self.pairs} new pairs cannot be judged: no verifiable answer decides "
            f"them and no judge has been shown competent on pairs like them ({reasons})"
        )

    def describe(self) -> str:
        failed = self.disagreeing
        if failed is not None:
            return failed.describe()
        parts = []
        if self.verifier is not None:
            parts.append(self.verifier.describe())
        if self.audit is not None:
            verdict = "does not count in this run" if self.judge_discredited else "counts"
            parts.append(f"audit of {self.audit.describe()}: it {verdict}")
        if self.model is not None:
            parts.append(self.model.describe())
        if self.unjudged:
            if self.model_judge is None:
                parts.append(f"{self.unjudged} pair(s) not judged: no champion reward model to ask yet")
            else:
                parts.append(f"{self.describe_unjudged()}; the way on: {WAYS_ON}")
        return "; ".join(parts) or "no pair to judge"

    def as_dict(self) -> dict[str, Any]:
        deciding = self.disagreeing or self.verifier or self.model
        return {
            **(deciding.as_dict() if deciding is not None else {}),
            "check": "label_check",
            "status": self.status,
            "passed": self.passed,
            "message": self.describe(),
            "pairs": self.pairs,
            "verifier": self.verifier.as_dict() if self.verifier else None,
            "judge_audit": None if self.audit is None else {
                **self.audit.as_dict(), "counts": not self.judge_discredited,
            },
            "model": self.model.as_dict() if self.model else None,
            "competence": [c.as_dict() for c in self.competence],
            "unjudged": {
                "pairs": self.unjudged,
                "reasons": self.unjudged_reasons,
                "examples": self.unjudged_examples,
                "ways_on": WAYS_ON if self.unjudged and self.model_judge else None,
            },
        }  # fmt: skip


class UnjudgedLabels(CannotJudge):
    """Some new pairs have no judge that can judge them: a scheduled run must not train on them."""

    def __init__(self, verdict: LabelVerdict, report_path: str | None = None):
        unjudged = verdict.describe_unjudged()
        super().__init__(f"{unjudged}. The way on: {WAYS_ON}", report_path, unjudged)
        self.verdict = verdict

    @property
    def examples(self) -> list[dict[str, Any]]:
        return self.verdict.unjudged_examples


# ---------------------------------------------------------------- the checks


def _where(pair: Mapping[str, Any]) -> str | None:
    where = pair.get(WHERE)
    return None if where is None else str(where)


def _agreement_check(
    pairs: Sequence[Mapping[str, Any]],
    agree: Sequence[bool],
    accuracy: float,
    max_gap: float,
    judge: str,
    slice_fields: Sequence[str],
    min_slice_pairs: int,
    example: Callable[[int], dict[str, Any]],
    num_examples: int,
) -> LabelCheck:
    """A judge's agreement with the labels, overall and per slice; examples of disagreeing pairs,
    those in a broken slice first."""
    groups = _pair_groups(pairs, slice_fields)
    slices = slice_agreement(groups, agree, min_slice_pairs)
    check = LabelCheck(wilson(sum(agree), len(agree)), accuracy, max_gap, slices=slices, judge=judge)
    first = _in_broken_slices(groups, check)
    wrong = sorted((i for i, ok in enumerate(agree) if not ok), key=lambda i: i not in first)
    return replace(check, examples=[example(i) for i in wrong[:num_examples]])


def check_label_agreement(
    records: Sequence[dict[str, Any]],
    scorer: Scorer,
    champion_accuracy: float,
    max_gap: float,
    max_pairs: int = 500,
    seed: int = 0,
    num_examples: int = 5,
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS,
    min_slice_pairs: int = MIN_SLICE_PAIRS,
) -> LabelCheck | None:
    """A model judge against the labels on up to ``max_pairs`` of the new pairs, overall and per
    slice, as if it were competent on all of them (:func:`judge_labels` asks that first); None
    when there are no pairs to check. The disagreeing examples come from the broken slices first."""
    from alignflow.evaluation.metrics import preference_pairs, score_pairs

    pairs = _sample(preference_pairs(records), max_pairs, seed)
    if not pairs:
        return None
    chosen, rejected = score_pairs(scorer, pairs)
    agree = [c > r for c, r in zip(chosen, rejected, strict=True)]
    return _agreement_check(
        pairs, agree, champion_accuracy, max_gap, CHAMPION_JUDGE, slice_fields, min_slice_pairs,
        lambda i: _scored_example(pairs[i], chosen[i], rejected[i]), num_examples,
    )  # fmt: skip


def _sample(pairs: list[Any], max_pairs: int, seed: int) -> list[Any]:
    return random.Random(seed).sample(pairs, max_pairs) if len(pairs) > max_pairs else pairs


def _scored_example(pair: Mapping[str, Any], chosen: float, rejected: float) -> dict[str, Any]:
    from alignflow.models.prompting import completion_text

    return {
        "id": pair.get("id"),
        "where": _where(pair),
        "prompt": as_text(pair["prompt"]),
        "chosen": completion_text(pair["chosen"]),
        "rejected": completion_text(pair["rejected"]),
        "reward_chosen": float(chosen),
        "reward_rejected": float(rejected),
    }


@dataclass(frozen=True)
class _Answered:
    """A new pair with the reference answer a verifier gives it (None: no verifier knows it)."""

    pair: Mapping[str, Any]
    chosen: str
    rejected: str
    answer: int | None
    by: str | None

    @property
    def chosen_right(self) -> bool | None:
        """Whether the answer says the chosen side is the right one (None: it cannot tell)."""
        from alignflow.data.answers import correctness_reward

        if self.answer is None:
            return None
        right = correctness_reward(self.chosen, self.answer), correctness_reward(self.rejected, self.answer)
        return None if right[0] == right[1] else right[0] > right[1]

    def for_slices(self) -> dict[str, Any]:
        """The pair with its answer in metadata, so its problem slice is named without one."""
        metadata = dict(self.pair.get("metadata") or {})
        metadata.setdefault("answer", self.answer)
        return {**self.pair, "metadata": metadata}


def _answered(pairs: Sequence[Mapping[str, Any]], verifiers: Any) -> list[_Answered]:
    from alignflow.data.verifiers import reference_answer
    from alignflow.models.prompting import completion_text

    out = []
    for pair in pairs:
        answer, by = reference_answer(pair, verifiers)
        out.append(
            _Answered(pair, completion_text(pair["chosen"]), completion_text(pair["rejected"]), answer, by)
        )
    return out


def _verified_example(item: _Answered, scores: tuple[float, float] | None) -> dict[str, Any]:
    from alignflow.data.answers import extract_answer

    example = {
        "id": item.pair.get("id"),
        "where": _where(item.pair),
        "prompt": as_text(item.pair["prompt"]),
        "chosen": item.chosen,
        "rejected": item.rejected,
        "answer": item.answer,
        "answer_from": item.by,
        "chosen_says": extract_answer(item.chosen),
        "rejected_says": extract_answer(item.rejected),
    }
    if scores is not None:
        example["reward_chosen"], example["reward_rejected"] = float(scores[0]), float(scores[1])
    return example


def check_answer_labels(
    records: Sequence[dict[str, Any]],
    max_gap: float,
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS,
    min_slice_pairs: int = MIN_SLICE_PAIRS,
    num_examples: int = 5,
    verifiers: Any = None,
) -> LabelCheck | None:
    """The labels against the pairs' reference answers (their ``metadata.answer``, else a
    registered verifier's; ``verifiers={}`` asks none), overall and per slice: on pairs where
    exactly one side states the right number, is it the chosen one? None when no pair has an
    answer that decides."""
    from alignflow.evaluation.metrics import preference_pairs

    decided = [a for a in _answered(preference_pairs(records), verifiers) if a.chosen_right is not None]
    return _verifier_check(decided, None, max_gap, slice_fields, min_slice_pairs, num_examples)


def _verifier_check(
    decided: Sequence[_Answered],
    scores: Sequence[tuple[float, float]] | None,
    max_gap: float,
    slice_fields: Sequence[str],
    min_slice_pairs: int,
    num_examples: int,
) -> LabelCheck | None:
    if not decided:
        return None
    agree = [bool(a.chosen_right) for a in decided]
    return _agreement_check(
        [a.for_slices() for a in decided], agree, 1.0, max_gap, ANSWERS_JUDGE, slice_fields, min_slice_pairs,
        lambda i: _verified_example(decided[i], None if scores is None else scores[i]), num_examples,
    )  # fmt: skip


def judge_labels(
    records: Sequence[dict[str, Any]],
    max_gap: float,
    judge: ModelJudge | None = None,
    *,
    verifiers: Any = None,
    max_pairs: int = 500,
    seed: int = 0,
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS,
    min_slice_pairs: int = MIN_SLICE_PAIRS,
    num_examples: int = 5,
    min_matched: int = MIN_MATCHED_PAIRS,
) -> LabelVerdict | None:
    """The new labels judged by the verifiers first, then by ``judge`` where it has passed its
    audit against them and been shown competent on pairs like them; None when there are no pairs.

    ``verifiers``: name -> verifier (default: every registered one; ``{}``: none, only the rows'
    own ``metadata.answer`` decides).
    """
    from alignflow.evaluation.metrics import preference_pairs

    pairs = _sample(preference_pairs(records), max_pairs, seed)
    if not pairs:
        return None
    answered = _answered(pairs, verifiers)
    scores: list[tuple[float, float]] | None = None
    if judge is not None:
        scores = _scores(judge.scorer, [(a.pair["prompt"], a.chosen, a.rejected) for a in answered])
    decided = [i for i, a in enumerate(answered) if a.chosen_right is not None]
    rest = [i for i, a in enumerate(answered) if a.chosen_right is None]
    verifier = _verifier_check(
        [answered[i] for i in decided], None if scores is None else [scores[i] for i in decided],
        max_gap, slice_fields, min_slice_pairs, num_examples,
    )  # fmt: skip
    verdict = LabelVerdict(len(pairs), verifier=verifier, model_judge=None if judge is None else judge.name)
    if not rest:
        if judge is None or scores is None or not decided:
            return verdict
        return replace(verdict, audit=_audit(judge, answered, scores, decided, max_gap))
    if judge is None or scores is None:
        return replace(verdict, unjudged=len(rest), unjudged_reasons={"no model judge": len(rest)})
    audit = _audit(judge, answered, scores, decided, max_gap) if decided else None
    verdict = replace(verdict, audit=audit)
    if audit is not None and not audit.passed:
        shown = audit.agreement.describe()
        failed = f"{judge.name} failed its audit against the verifiable answers ({shown})"
        return _with_unjudged(verdict, answered, rest, dict.fromkeys(rest, failed), num_examples)
    competence, competent_for = _competence(judge, answered, rest, max_gap, min_matched, max_pairs, seed)
    verdict = replace(verdict, competence=competence)
    judged = [i for i in rest if competent_for[i].shown]
    if judged:
        agree = [scores[i][0] > scores[i][1] for i in judged]
        model = _agreement_check(
            [answered[i].pair for i in judged], agree, judge.accuracy, max_gap, judge.name, slice_fields,
            min_slice_pairs, lambda k: _scored_example(answered[judged[k]].pair, *scores[judged[k]]),
            num_examples,
        )  # fmt: skip
        subject = "the labels of the new pairs of kinds it is shown competent on"
        verdict = replace(verdict, model=replace(model, subject=subject))
    why = {
        i: f"{judge.name}, on pairs of kind {competent_for[i].kind.describe()}: {competent_for[i].describe()}"
        for i in rest
        if not competent_for[i].shown
    }
    return _with_unjudged(verdict, answered, [i for i in rest if i in why], why, num_examples)


def _scores(scorer: Scorer, triples: Sequence[tuple[Any, str, str]]) -> list[tuple[float, float]]:
    prompts = [t[0] for t in triples]
    chosen = scorer(prompts, [t[1] for t in triples])
    rejected = scorer(prompts, [t[2] for t in triples])
    return [(float(c), float(r)) for c, r in zip(chosen, rejected, strict=True)]


def _audit(
    judge: ModelJudge,
    answered: Sequence[_Answered],
    scores: Sequence[tuple[float, float]],
    decided: Sequence[int],
    max_gap: float,
) -> LabelCheck:
    """The model judge against the verifiable answers on the pairs they decide: does it prefer
    the side that states the right number? (The labels play no part.)"""
    agree = [(scores[i][0] > scores[i][1]) == answered[i].chosen_right for i in decided]
    return LabelCheck(
        wilson(sum(agree), len(agree)), judge.accuracy, max_gap, judge=judge.name,
        subject="the verifiable answers, on the new pairs they decide",
    )  # fmt: skip


def _competence(
    judge: ModelJudge,
    answered: Sequence[_Answered],
    rest: Sequence[int],
    max_gap: float,
    min_matched: int,
    max_pairs: int,
    seed: int,
) -> tuple[list[Competence], dict[int, Competence]]:
    """The judge's accuracy on the held-out pairs matched to each kind of new pair it would judge."""
    from alignflow.evaluation.metrics import preference_pairs

    reference = _answered(_sample(preference_pairs(judge.reference), max_pairs, seed), None)
    # the held-out pairs' labels, set right by their answers where those decide
    oriented = [
        (a.pair["prompt"], a.chosen, a.rejected) if a.chosen_right is not False
        else (a.pair["prompt"], a.rejected, a.chosen)
        for a in reference
    ]  # fmt: skip
    texts = [t for i in rest for t in (answered[i].chosen, answered[i].rejected)]
    templates = templates_of(texts + [t for _, c, r in oriented for t in (c, r)])
    kinds = {i: pair_kind(answered[i].chosen, answered[i].rejected, templates) for i in rest}
    ref_kinds = [pair_kind(c, r, templates) for _, c, r in oriented]
    wanted = set(kinds.values())
    needed = [j for j, kind in enumerate(ref_kinds) if any(kind.matches(w) for w in wanted)]
    ref_scores = dict(zip(needed, _scores(judge.scorer, [oriented[j] for j in needed]), strict=True))
    threshold = judge.accuracy - max_gap
    by_kind: dict[PairKind, Competence] = {}
    counts = Counter(kinds.values())
    for kind in sorted(wanted, key=lambda k: -counts[k]):
        matched = [j for j in needed if ref_kinds[j].matches(kind)]
        right = sum(ref_scores[j][0] > ref_scores[j][1] for j in matched)
        by_kind[kind] = Competence(kind, wilson(right, len(matched)), threshold, min_matched, counts[kind])
    return list(by_kind.values()), {i: by_kind[kinds[i]] for i in rest}


def _with_unjudged(
    verdict: LabelVerdict,
    answered: Sequence[_Answered],
    unjudged: Sequence[int],
    why: Mapping[int, str],
    num_examples: int,
) -> LabelVerdict:
    if not unjudged:
        return verdict
    reasons = Counter(why[i] for i in unjudged)
    examples = [
        {
            "id": answered[i].pair.get("id"),
            "where": _where(answered[i].pair),
            "prompt": as_text(answered[i].pair["prompt"]),
            "chosen": answered[i].chosen,
            "rejected": answered[i].rejected,
            "why": why[i],
        }
        for i in unjudged[:num_examples]
    ]
    return replace(
        verdict,
        unjudged=len(unjudged),
        unjudged_reasons=dict(reasons.most_common()),
        unjudged_examples=examples,
    )


# ---------------------------------------------------------------- the add_dataset hooks


def _write(data: dict[str, Any], report_path: str | Path) -> str:
    path = Path(report_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    return str(path)


def raise_on(verdict: LabelVerdict, report_path: str | Path) -> None:
    """Write the verdict's report; raise :class:`LabelDisagreement` or :class:`UnjudgedLabels`
    unless it passed."""
    path = _write(verdict.as_dict(), report_path)
    failed = verdict.disagreeing
    if failed is not None:
        raise LabelDisagreement(failed, path, verdict)
    if verdict.status == CANNOT_JUDGE:
        raise UnjudgedLabels(verdict, path)


def answer_label_guard(
    max_gap: float,
    report_path: str | Path,
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS,
    verifiers: Any = None,
) -> Callable[[list[dict[str, Any]]], None]:
    """A ``check_labels`` hook with no model judge: raises :class:`LabelDisagreement` where the
    labels contradict the pairs' reference answers (the report is written either way)."""

    def check(records: list[dict[str, Any]]) -> None:
        result = check_answer_labels(records, max_gap, slice_fields, verifiers=verifiers)
        if result is not None:
            path = _write(result.as_dict(), report_path)
            if not result.passed:
                raise LabelDisagreement(result, path)

    return check


def all_of(
    *guards: Callable[[list[dict[str, Any]]], None] | None,
) -> Callable[[list[dict[str, Any]]], None] | None:
    """One ``check_labels`` hook running each given guard in turn (None when none is given)."""
    present = [g for g in guards if g is not None]
    if not present:
        return None

    def check(records: list[dict[str, Any]]) -> None:
        for guard in present:
            guard(records)

    return check


def _pair_groups(pairs: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> dict[str, list[int]]:
    """Slice name -> indices of the pairs in it (:func:`~alignflow.evaluation.slices.group_items`)."""
    return group_items([p["prompt"] for p in pairs], [p.get("metadata") for p in pairs], fields)


def slice_agreement(
    groups: dict[str, list[int]], agree: Sequence[bool], min_pairs: int
) -> dict[str, Estimate]:
    """The judge's agreement with the labels on each slice of ``min_pairs`` pairs or more."""
    return {
        name: wilson(sum(agree[i] for i in indices), len(indices))
        for name, indices in groups.items()
        if len(indices) >= min_pairs
    }


def _in_broken_slices(groups: dict[str, list[int]], check: LabelCheck) -> set[int]:
    """Indices of the pairs in a broken slice: the examples to show first."""
    return {i for name in check.broken_slices for i in groups.get(name, [])}


@dataclass
class LabelGuard:
    """The ``check_labels`` hook of ``add_dataset`` (:func:`judge_labels`): the verifiers, then
    the reward model in ``judge_dir`` (pinned accuracy ``champion_accuracy``; None: no model
    judge yet) where it passes its audit and is competent on held-out ``reference`` pairs like
    the new ones. Raises :class:`LabelDisagreement` or :class:`UnjudgedLabels`; the report is
    written either way (when there are pairs), and ``verdict`` keeps the last one."""

    judge_dir: str | None
    champion_accuracy: float | None
    max_gap: float
    report_path: str | Path
    max_pairs: int = 500
    seed: int = 0
    reference: Sequence[Mapping[str, Any]] = ()
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS
    verifiers: Any = None
    verdict: LabelVerdict | None = None

    def __call__(self, records: list[dict[str, Any]]) -> None:
        from alignflow.models.factory import inference_device
        from alignflow.models.reward_scorer import load_reward_scorer

        judge = None
        if self.judge_dir is not None and self.champion_accuracy is not None:
            scorer = load_reward_scorer(self.judge_dir, device=inference_device())
            judge = ModelJudge(scorer, self.champion_accuracy, self.reference)
        self.verdict = judge_labels(
            records, self.max_gap, judge, verifiers=self.verifiers, max_pairs=self.max_pairs,
            seed=self.seed, slice_fields=self.slice_fields,
        )  # fmt: skip
        if self.verdict is not None:
            raise_on(self.verdict, self.report_path)


def label_guard(
    judge_dir: str | None,
    champion_accuracy: float | None,
    max_gap: float,
    report_path: str | Path,
    max_pairs: int = 500,
    seed: int = 0,
    *,
    reference: Sequence[Mapping[str, Any]] = (),
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS,
    verifiers: Any = None,
) -> LabelGuard:
    """The label check as an ``add_dataset`` hook (:class:`LabelGuard`)."""
    return LabelGuard(
        judge_dir,
        champion_accuracy,
        max_gap,
        report_path,
        max_pairs,
        seed,
        reference,
        slice_fields,
        verifiers,
    )
