"""A frozen copy of the row-by-row validation from before issue #18 (tests only).

The vectorised, streaming validation must give every row the same verdict, reason code
and message as this oracle; it is kept here verbatim so the comparison cannot drift.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from alignflow.data.checks import TEXT_FIELDS, as_text, check_record, label_imbalance, near_key_text
from alignflow.data.config import DataConfig
from alignflow.data.issues import UNREADABLE_FILE_REASONS, Issue, Reason
from alignflow.data.normalize import RowError, normalize_row
from alignflow.data.readers import RawRow, read_rows
from alignflow.data.report import build_report
from alignflow.data.split import leaked_prompts, prompt_key
from alignflow.data.validation import (  # unchanged by the bulk path: shared, not copied
    Entry,
    Validated,
    _apply_expectations,
    _entry_issue,
    describe_inputs,
    load_tokenizer,
)


class DuplicateIndex:
    """Remembers content already seen; the first occurrence is kept, later ones are flagged."""

    def __init__(self) -> None:
        self.exact: dict[tuple, str] = {}
        self.near: dict[tuple, str] = {}

    def check(self, record: dict[str, Any], where: str) -> None:
        content = tuple(as_text(record.get(f)) for f in TEXT_FIELDS[record["kind"]])
        exact = (record["kind"], content, record.get("score"), record.get("label"))
        near = (
            record["kind"],
            tuple(near_key_text(c) for c in content),
            record.get("score"),
            record.get("label"),
        )
        if exact in self.exact:
            raise RowError(Reason.DUPLICATE_EXACT, f"same content as {self.exact[exact]}", "prompt")
        if near in self.near:
            raise RowError(
                Reason.DUPLICATE_NEAR,
                f"same text up to case/spacing/punctuation as {self.near[near]}",
                "prompt",
            )
        self.exact[exact] = where
        self.near[near] = where


def _issue(error: RowError, raw: RawRow) -> Issue:
    return Issue(error.code, str(error), raw.file, raw.row, error.field, raw.data)


def _normalise_all(
    rows: Iterable[RawRow], config: DataConfig, tokenizer: Any, issues: list[Issue]
) -> tuple[int, list[Entry]]:
    count, candidates = 0, []
    for raw in rows:
        count += 1
        if raw.issue is not None:
            issues.append(raw.issue)
            continue
        try:
            record = normalize_row(raw.data, config.column_mapping)
            check_record(record, tokenizer, config.max_tokens)
        except RowError as error:
            issues.append(_issue(error, raw))
            continue
        candidates.append(Entry(record, raw.file, raw.row, raw.split, raw.data))
    return count, candidates


def _dedupe(entries: list[Entry], issues: list[Issue]) -> list[Entry]:
    index, kept = DuplicateIndex(), []
    for entry in entries:
        try:
            index.check(entry.record, f"{entry.file}:{entry.row}")
        except RowError as error:
            issues.append(_entry_issue(error, entry))
            continue
        kept.append(entry)
    return kept


def _drop_leakage(entries: list[Entry], issues: list[Issue]) -> list[Entry]:
    """With user-supplied splits, eval rows whose prompt also appears in train go to quarantine."""
    train = [e.record for e in entries if e.split == "train"]
    evaluation = [e.record for e in entries if e.split == "eval"]
    leaked = leaked_prompts(train, evaluation)
    if not leaked:
        return entries
    kept = []
    for entry in entries:
        if entry.split == "eval" and prompt_key(entry.record["prompt"]) in leaked:
            issues.append(
                Issue(
                    Reason.PROMPT_LEAKAGE,
                    "this eval prompt also appears in the train split",
                    entry.file,
                    entry.row,
                    "prompt",
                    entry.original,
                )
            )
        else:
            kept.append(entry)
    return kept


def _warnings(entries: list[Entry], config: DataConfig) -> list[dict[str, Any]]:
    labels = [e.record["label"] for e in entries if e.record["kind"] == "unpaired"]
    message = label_imbalance(labels, config.max_label_fraction)
    return [{"code": str(Reason.LABEL_IMBALANCE), "message": message}] if message else []


def validate_rows(
    rows: Iterable[RawRow],
    config: DataConfig,
    inputs: list[dict[str, Any]] | None = None,
    tokenizer: Any = None,
) -> Validated:
    """The row-by-row validation as it was before issue #18."""
    issues: list[Issue] = []
    input_rows, entries = _normalise_all(rows, config, tokenizer, issues)
    entries, summary = _apply_expectations(entries, config, issues)
    entries = _drop_leakage(_dedupe(entries, issues), issues)
    unreadable = sorted({i.file for i in issues if i.code in UNREADABLE_FILE_REASONS})
    truncated = sorted({i.file for i in issues if i.code == Reason.FILE_TRUNCATED})
    report = build_report(
        inputs=inputs or [],
        input_rows=input_rows,
        kept=len(entries),
        issues=issues,
        warnings=_warnings(entries, config),
        expectations=summary,
        kinds=Counter(str(e.record["kind"]) for e in entries),
        max_bad_fraction=config.max_bad_fraction,
        unreadable=unreadable,
        truncated=truncated,
    )
    return Validated(entries, issues, report)


def validate_paths(
    paths: str | Path | list[str | Path],
    config: DataConfig | None = None,
    fmt: str | None = None,
    tokenizer: Any = None,
) -> Validated:
    """Read every path (files, plain directories, ``datasets`` directories) and validate the rows."""
    config = config or DataConfig()
    paths = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    fmt = fmt or config.format
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)

    def rows() -> Iterable[RawRow]:
        for path in paths:
            yield from read_rows(path, fmt, hint_splits=path.is_dir())

    return validate_rows(rows(), config, describe_inputs(paths, fmt), tokenizer)
