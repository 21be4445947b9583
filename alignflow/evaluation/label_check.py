"""Do the new labels agree with the champion reward model? A check against poisoned data.

A data version whose chosen and rejected sides were swapped (by mistake or on purpose)
passes every row check: the rows are well formed, only their labels lie. The champion
reward model has a measured accuracy on the pinned pairs; on honest new pairs of the same
task it should agree with the labels about as often. When even the upper bound of its
agreement falls more than ``data.label_check_max_gap`` below that accuracy, the labels
disagree with everything the pipeline has learnt so far, and the run stops before
training with reason ``label_disagreement`` (nothing is versioned or registered).

A narrow backdoor hides in the overall figure: wrong answers chosen on two problems out of
a hundred move it by a few points. So the same bound is asked of every slice of the new
pairs (:mod:`alignflow.evaluation.slices`: each problem across phrasings, each phrasing, a
declared slice) with ``min_slice_pairs`` pairs or more, and the check names the slices whose
labels the champion contradicts.

Where the pairs carry verifiable answers (``metadata.answer``), the answers judge the labels
as well, with no model in the way (:func:`check_answer_labels`): a chosen response that states
a wrong number over a rejected one that states the right number contradicts them. Honest
labels never do, so a slice where they disagree stops the run the same way, on the first
run too (there is no champion to ask yet), and whatever the champion reward model believes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from alignflow.data.checks import as_text
from alignflow.errors import DataCheckStop
from alignflow.evaluation.intervals import Estimate, wilson
from alignflow.evaluation.slices import DEFAULT_SLICE_FIELDS, group_items

LABEL_DISAGREEMENT = "label_disagreement"
CHAMPION_JUDGE = "the champion reward model"
ANSWERS_JUDGE = "the verifiable answers (metadata.answer)"
MIN_SLICE_PAIRS = 8  # fewer pairs in a slice are not judged on their own (they count overall)
Scorer = Callable[[Sequence[Any], Sequence[Any]], list[float]]


@dataclass(frozen=True)
class LabelCheck:
    """The champion reward model's agreement with the new labels, and whether it is too low."""

    agreement: Estimate
    champion_accuracy: float
    max_gap: float
    examples: list[dict[str, Any]] = field(default_factory=list)
    slices: dict[str, Estimate] = field(default_factory=dict)  # agreement per judged slice
    judge: str = CHAMPION_JUDGE

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
        basis = (
            f"its pinned-set accuracy is {self.champion_accuracy:.3f}"
            if self.judge == CHAMPION_JUDGE
            else "where they decide, honest labels always agree"
        )
        text = (
            f"{self.judge} agree{'s' if self.judge == CHAMPION_JUDGE else ''} with "
            f"{self.agreement.describe()} of the new pairs' labels; {basis}, so at least "
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
    """The new data's labels contradict the champion reward model: the run must stop."""

    reason = LABEL_DISAGREEMENT
    report_words = "examples in"

    def __init__(self, check: LabelCheck, report_path: str | None = None):
        super().__init__(check.describe(), report_path)
        self.check = check


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
    """Score up to ``max_pairs`` of the new pairs, overall and per slice; None when there are
    no pairs to check. The disagreeing examples come from the broken slices first."""
    from alignflow.evaluation.metrics import preference_pairs, score_pairs
    from alignflow.models.prompting import completion_text

    pairs = preference_pairs(records)
    if not pairs:
        return None
    if len(pairs) > max_pairs:
        pairs = random.Random(seed).sample(pairs, max_pairs)
    chosen, rejected = score_pairs(scorer, pairs)
    agree = [c > r for c, r in zip(chosen, rejected, strict=True)]
    groups = _pair_groups(pairs, slice_fields)
    slices = slice_agreement(groups, agree, min_slice_pairs)
    check = LabelCheck(wilson(sum(agree), len(agree)), champion_accuracy, max_gap, slices=slices)
    first = _in_broken_slices(groups, check)
    order = sorted(range(len(pairs)), key=lambda i: i not in first)
    pairs = [pairs[i] for i in order]
    chosen = [chosen[i] for i in order]
    rejected = [rejected[i] for i in order]
    agree = [agree[i] for i in order]
    disagreeing = [
        {
            "id": p.get("id"),
            "prompt": as_text(p["prompt"]),
            "chosen": completion_text(p["chosen"]),
            "rejected": completion_text(p["rejected"]),
            "reward_chosen": float(c),
            "reward_rejected": float(r),
        }
        for p, c, r, ok in zip(pairs, chosen, rejected, agree, strict=True)
        if not ok
    ][:num_examples]
    return replace(check, examples=disagreeing)


def check_answer_labels(
    records: Sequence[dict[str, Any]],
    max_gap: float,
    slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS,
    min_slice_pairs: int = MIN_SLICE_PAIRS,
    num_examples: int = 5,
) -> LabelCheck | None:
    """The labels against the pairs' own verifiable answers, overall and per slice: on pairs
    where exactly one side states the right number, is it the chosen one? None when no pair
    has an answer that decides."""
    from alignflow.data.answers import correctness_reward
    from alignflow.evaluation.metrics import preference_pairs
    from alignflow.models.prompting import completion_text

    decided, agree = [], []
    for pair in preference_pairs(records):
        answer = (pair.get("metadata") or {}).get("answer")
        if answer is None:
            continue
        chosen, rejected = completion_text(pair["chosen"]), completion_text(pair["rejected"])
        right = correctness_reward(chosen, answer), correctness_reward(rejected, answer)
        if right[0] != right[1]:
            decided.append({**pair, "chosen": chosen, "rejected": rejected, "answer": answer})
            agree.append(right[0] > right[1])
    if not decided:
        return None
    groups = _pair_groups(decided, slice_fields)
    slices = slice_agreement(groups, agree, min_slice_pairs)
    check = LabelCheck(wilson(sum(agree), len(agree)), 1.0, max_gap, slices=slices, judge=ANSWERS_JUDGE)
    first = _in_broken_slices(groups, check)
    wrong = sorted((i for i, ok in enumerate(agree) if not ok), key=lambda i: i not in first)
    keys = ("id", "prompt", "chosen", "rejected", "answer")
    examples = [
        {k: as_text(decided[i][k]) if k == "prompt" else decided[i].get(k) for k in keys} for i in wrong
    ]
    return replace(check, examples=examples[:num_examples])


def answer_label_guard(
    max_gap: float, report_path: str | Path, slice_fields: Sequence[str] = DEFAULT_SLICE_FIELDS
) -> Callable[[list[dict[str, Any]]], None]:
    """A ``check_labels`` hook: raises :class:`LabelDisagreement` where the labels contradict
    the pairs' verifiable answers (the report is written either way)."""

    def check(records: list[dict[str, Any]]) -> None:
        result = check_answer_labels(records, max_gap, slice_fields)
        if result is not None:
            _report(result, report_path)

    return check


def _report(result: LabelCheck, report_path: str | Path) -> None:
    path = Path(report_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.as_dict(), indent=2, default=str), encoding="utf-8")
    if not result.passed:
        raise LabelDisagreement(result, str(path))


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


def label_guard(
    judge_dir: str,
    champion_accuracy: float,
    max_gap: float,
    report_path: str | Path,
    max_pairs: int = 500,
    seed: int = 0,
) -> Callable[[list[dict[str, Any]]], None]:
    """A ``check_labels`` hook for ``add_dataset``: raises :class:`LabelDisagreement` on poisoned labels.

    The report (agreement, threshold, disagreeing examples) is written either way.
    """

    def check(records: list[dict[str, Any]]) -> None:
        from alignflow.models.reward_scorer import load_reward_scorer

        result = check_label_agreement(
            records, load_reward_scorer(judge_dir), champion_accuracy, max_gap, max_pairs, seed
        )
        if result is not None:
            _report(result, report_path)

    return check
