"""The pinned set is never trained on: a data version's training rows checked against it.

Leakage inside one data version is caught at validation (``prompt_leakage``). Across
versions it is not: the pinned set was frozen from an earlier version's eval split, and a
later version split with another ``data.split_seed``, a user ``split`` column, or new rows
that repeat a pinned prompt puts pinned prompts into training. A model is then judged on
what it learnt by heart, and the yardstick promotes it. So before a version is written (and
again when an existing one is reused), every training row whose prompt matches a pinned
prompt (compared normalised: Unicode NFKC, case, whitespace and trailing punctuation) stops
the run with reason ``pinned_prompt_in_training``, naming the file, row and prompt of each.
Other phrasings of a pinned problem are not matches: they are what the model should learn from.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alignflow.data.checks import as_text
from alignflow.errors import DataCheckStop

PINNED_PROMPT_IN_TRAINING = "pinned_prompt_in_training"
# a training row as the check sees it: the file and row it came from, and its record
TrainingRow = tuple[str, int | None, Mapping[str, Any]]
_SPACES = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.?!:;,]+$")


def normalised_prompt(prompt: Any) -> str:
    """What two prompts are compared by: NFKC text, case-folded, spaces collapsed, no end punctuation."""
    text = unicodedata.normalize("NFKC", as_text(prompt) or "")
    return _TRAILING.sub("", _SPACES.sub(" ", text).strip()).casefold()


@dataclass(frozen=True)
class Clash:
    """One training row whose prompt is a pinned prompt."""

    file: str
    row: int | None
    id: str | None
    prompt: str

    def describe(self) -> str:
        where = self.file if self.row is None else f"{self.file}:{self.row}"
        return f"{where} [prompt]: {self.prompt[:80]!r}"


class PinnedSetContamination(DataCheckStop):
    """Training rows repeat pinned prompts: a model would be judged on what it trained on."""

    reason = PINNED_PROMPT_IN_TRAINING

    def __init__(self, clashes: Sequence[Clash], pinned: int, report_path: str | None = None):
        prompts = len({normalised_prompt(c.prompt) for c in clashes})
        first = "; ".join(c.describe() for c in clashes[:3])
        message = (
            f"{len(clashes)} training row(s) repeat {prompts} of the {pinned} pinned prompts, e.g. {first}; "
            "the pinned set must never be trained on: drop those rows, or keep the split that froze "
            "the pinned set (data.split_seed), or pin a new set (delete golden.dvc)"
        )
        super().__init__(message, report_path)
        self.clashes = list(clashes)


def pinned_prompt_count(pinned: Iterable[Mapping[str, Any]]) -> int:
    """Distinct pinned prompts, compared as the check compares them."""
    return len({normalised_prompt(r["prompt"]) for r in pinned if r.get("prompt") is not None})


def find_clashes(rows: Iterable[TrainingRow], pinned: Iterable[Mapping[str, Any]]) -> list[Clash]:
    """The training rows whose normalised prompt is one of the pinned rows' prompts."""
    keys = {normalised_prompt(r["prompt"]) for r in pinned if r.get("prompt") is not None}
    return [
        Clash(file, row, record.get("id"), as_text(record["prompt"]) or "")
        for file, row, record in rows
        if normalised_prompt(record["prompt"]) in keys
    ]


def write_report(clashes: Sequence[Clash], pinned: int, path: str | Path) -> str:
    """Every clashing row (file, row, id, prompt) as JSON, for the run's artifacts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "check": PINNED_PROMPT_IN_TRAINING,
        "passed": not clashes,
        "pinned_prompts": pinned,
        "clashing_rows": len(clashes),
        "rows": [asdict(c) for c in clashes],
    }
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return str(path)


def contamination_guard(
    pinned: Sequence[Mapping[str, Any]], report_path: str | Path
) -> Callable[[list[TrainingRow]], None]:
    """A ``check_training`` hook for ``add_dataset``: raises :class:`PinnedSetContamination`
    when a training row repeats a pinned prompt (the report names every such row)."""
    distinct = pinned_prompt_count(pinned)

    def check(rows: list[TrainingRow]) -> None:
        clashes = find_clashes(rows, pinned)
        if clashes:
            raise PinnedSetContamination(clashes, distinct, write_report(clashes, distinct, report_path))

    return check
