"""Slices of the pinned set, and how a challenger does on each against the champion.

One overall accuracy hides a broken slice: a challenger right on more problems overall can
be wrong on every phrasing of the two problems someone poisoned. So the pinned items are
grouped into slices, and the challenger's change on each (its share right minus the
champion's, on the same items) gets a small-sample interval
(:func:`~alignflow.evaluation.intervals.paired_difference`). A slice of three items all lost
is systematic; one item lost is not evidence of anything, and its interval says so.

Where slices come from, for each pinned row:

- declared: a metadata field named in ``evaluation.slice_fields`` (``slice``, ``problem_id``,
  a benchmark's ``subset``...), as ``<field>=<value>``;
- ``problem``: for a row with a verifiable answer, the numbers its prompt asks about (in any
  order) and the answer: every phrasing of ``7 + 8`` (and ``8 + 7``) is one problem;
- ``phrasing``: the prompt with its numbers masked, so a policy that breaks on one way of
  asking shows up even when each problem is asked only once.

Rows with none of these (free text without numbers or metadata) fall into slices of one,
which are never judged: below ``min_items`` a slice cannot break, only an item can.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from alignflow.data.checks import as_text
from alignflow.evaluation.config import DEFAULT_SLICE_FIELDS
from alignflow.evaluation.intervals import Estimate, paired_difference

__all__ = ["DEFAULT_SLICE_FIELDS", "SliceChange", "group_items", "item_slices", "slice_changes"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")
NUMBER_MASK = "#"


@dataclass(frozen=True)
class SliceChange:
    """One slice: its items, how many each model got right, and the challenger's change."""

    name: str
    n: int
    champion_right: int
    challenger_right: int
    lost: int  # items the champion gets right and the challenger gets wrong
    gained: int
    change: Estimate  # challenger's share right minus the champion's, with its interval
    examples: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        low, high = self.change.low or 0.0, self.change.high or 0.0
        return (
            f"slice {self.name}: champion {self.champion_right}/{self.n}, challenger "
            f"{self.challenger_right}/{self.n} ({self.lost} lost, {self.gained} gained; change "
            f"{self.change.value:+.2f} [{low:+.2f}, {high:+.2f}])"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change": self.change.as_dict(), "describe": self.describe()}


def _plain(text: str) -> str:
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def problem_slice(prompt: Any, answer: Any) -> str | None:
    """``problem=7,8->15``: the prompt's numbers, sorted, and the answer (None without either)."""
    numbers = sorted(_NUMBER.findall(as_text(prompt) or ""), key=float)
    if answer is None or not numbers:
        return None
    return f"problem={','.join(numbers)}->{answer}"


def phrasing_slice(prompt: Any) -> str | None:
    """``phrasing=what is # plus #?``: the prompt with numbers masked (None without a number)."""
    text = as_text(prompt) or ""
    if not _NUMBER.search(text):
        return None
    return f"phrasing={_plain(_NUMBER.sub(NUMBER_MASK, text))}"


def item_slices(prompt: Any, metadata: Mapping[str, Any] | None, fields: Sequence[str]) -> list[str]:
    """Every slice one pinned row belongs to: declared fields first, then the derived ones."""
    metadata = metadata or {}
    names = [f"{f}={metadata[f]}" for f in fields if metadata.get(f) not in (None, "")]
    derived = (problem_slice(prompt, metadata.get("answer")), phrasing_slice(prompt))
    return names + [name for name in derived if name is not None]


def group_items(
    prompts: Sequence[Any], metadata: Sequence[Mapping[str, Any] | None], fields: Sequence[str]
) -> dict[str, list[int]]:
    """Slice name -> indices of its items, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for index, (prompt, meta) in enumerate(zip(prompts, metadata, strict=True)):
        for name in item_slices(prompt, meta, fields):
            groups.setdefault(name, []).append(index)
    return groups


def slice_changes(
    groups: Mapping[str, Sequence[int]],
    ours: Sequence[float | None],
    theirs: Sequence[float | None],
    min_items: int = 2,
    example: Callable[[int], dict[str, Any]] | None = None,
    num_examples: int = 3,
) -> list[SliceChange]:
    """Each slice of ``min_items`` judged items or more, worst first (by its interval's top).

    ``ours``/``theirs``: per item 1.0 right, 0.0 wrong, None not judged (challenger, champion).
    ``example(i)`` describes item ``i`` for the report (prompt, both completions).
    """
    changes = []
    for name, indices in groups.items():
        judged = [i for i in indices if ours[i] is not None and theirs[i] is not None]
        if len(judged) < min_items:
            continue
        # every judged item has both; the walrus lets the checker see that (it filters nothing)
        a = [float(x) for i in judged if (x := ours[i]) is not None]
        b = [float(y) for i in judged if (y := theirs[i]) is not None]
        lost = [i for i, x, y in zip(judged, a, b, strict=True) if y > 0.5 >= x]
        changes.append(
            SliceChange(
                name=name,
                n=len(judged),
                champion_right=int(sum(y > 0.5 for y in b)),
                challenger_right=int(sum(x > 0.5 for x in a)),
                lost=len(lost),
                gained=int(sum(x > 0.5 >= y for x, y in zip(a, b, strict=True))),
                change=paired_difference(a, b),
                examples=[example(i) for i in lost[:num_examples]] if example else [],
            )
        )
    return sorted(changes, key=lambda c: (c.change.high, c.change.value, c.name))
