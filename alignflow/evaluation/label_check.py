"""Do the new labels agree with the champion reward model? A check against poisoned data.

A data version whose chosen and rejected sides were swapped (by mistake or on purpose)
passes every row check: the rows are well formed, only their labels lie. The champion
reward model has a measured accuracy on the pinned pairs; on honest new pairs of the same
task it should agree with the labels about as often. When even the upper bound of its
agreement falls more than ``data.label_check_max_gap`` below that accuracy, the labels
disagree with everything the pipeline has learnt so far, and the run stops before
training with reason ``label_disagreement`` (nothing is versioned or registered).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignflow.data.checks import as_text
from alignflow.errors import DataCheckStop
from alignflow.evaluation.intervals import Estimate, wilson

LABEL_DISAGREEMENT = "label_disagreement"
Scorer = Callable[[Sequence[Any], Sequence[Any]], list[float]]


@dataclass(frozen=True)
class LabelCheck:
    """The champion reward model's agreement with the new labels, and whether it is too low."""

    agreement: Estimate
    champion_accuracy: float
    max_gap: float
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def threshold(self) -> float:
        return self.champion_accuracy - self.max_gap

    @property
    def passed(self) -> bool:
        return self.agreement.high is None or self.agreement.high >= self.threshold

    def describe(self) -> str:
        return (
            f"the champion reward model agrees with {self.agreement.describe()} of the new pairs' labels; "
            f"its pinned-set accuracy is {self.champion_accuracy:.3f}, so at least {self.threshold:.3f} "
            f"was expected (data.label_check_max_gap={self.max_gap:g})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": LABEL_DISAGREEMENT,
            "passed": self.passed,
            "agreement": self.agreement.as_dict(),
            "champion_accuracy": self.champion_accuracy,
            "max_gap": self.max_gap,
            "threshold": self.threshold,
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
) -> LabelCheck | None:
    """Score up to ``max_pairs`` of the new pairs; None when there are no pairs to check."""
    from alignflow.evaluation.metrics import preference_pairs, score_pairs
    from alignflow.models.prompting import completion_text

    pairs = preference_pairs(records)
    if not pairs:
        return None
    if len(pairs) > max_pairs:
        pairs = random.Random(seed).sample(pairs, max_pairs)
    chosen, rejected = score_pairs(scorer, pairs)
    agree = [c > r for c, r in zip(chosen, rejected, strict=True)]
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
    return LabelCheck(wilson(sum(agree), len(agree)), champion_accuracy, max_gap, disagreeing)


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
        if result is None:
            return
        path = Path(report_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.as_dict(), indent=2, default=str), encoding="utf-8")
        if not result.passed:
            raise LabelDisagreement(result, str(path))

    return check
