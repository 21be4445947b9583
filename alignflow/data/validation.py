"""Validation: read -> normalise -> row checks -> great-expectations -> cross-row checks -> report.

Every input row comes out either kept (with its file, row and any user-supplied split) or
as an :class:`Issue` bound for quarantine, so ``kept + quarantined == input rows`` holds by
construction and is written into the report.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from alignflow.data.checks import TEXT_FIELDS, DuplicateIndex, as_text, check_record, label_imbalance
from alignflow.data.config import DataConfig
from alignflow.data.expectations import run_expectations
from alignflow.data.issues import UNREADABLE_FILE_REASONS, Issue, Reason
from alignflow.data.normalize import RowError, normalize_row
from alignflow.data.readers import RawRow, detect_format, iter_input_files, read_rows
from alignflow.data.report import build_report, format_summary, write_report
from alignflow.data.split import leaked_prompts, prompt_key


@dataclass
class Entry:
    """A kept record and where it came from."""

    record: dict[str, Any]
    file: str
    row: int | None
    split: str | None = None
    original: Any = None


@dataclass
class Validated:
    """Full outcome of one validation: kept entries, issues (quarantine) and the report."""

    kept: list[Entry] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.report.get("passed"))


class ValidationResult(BaseModel):
    """The small, serialisable result pipeline tasks pass on (no rows, only counts and paths)."""

    passed: bool
    exit_code: int
    input_rows: int
    kept: int
    quarantined: int
    bad_fraction: float
    counts_by_reason: dict[str, int]
    report_path: str | None = None
    summary: str


def exit_code(report: dict[str, Any]) -> int:
    """CLI convention: 0 valid, 1 validation failed, 2 input that could not be read."""
    if report["unreadable_files"] or report["input_rows"] == 0:
        return 2
    return 0 if report["passed"] else 1


def file_sha256(path: Path) -> str:
    """sha256 of a file, or of every file of a directory in sorted order."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def describe_inputs(paths: list[Path], fmt: str | None) -> list[dict[str, Any]]:
    inputs = []
    for path in paths:
        if not path.exists():
            inputs.append({"path": str(path), "format": fmt, "sha256": None})
            continue
        for file in iter_input_files(path):
            try:
                file_fmt = fmt or detect_format(file)
            except ValueError:
                file_fmt = None
            inputs.append({"path": str(file), "format": file_fmt, "sha256": file_sha256(file)})
    return inputs


def load_tokenizer(config: DataConfig):
    if not config.tokenizer:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.tokenizer)


def _issue(error: RowError, raw: RawRow) -> Issue:
    return Issue(error.code, str(error), raw.file, raw.row, error.field, raw.data)


def _entry_issue(error: RowError | Any, entry: Entry) -> Issue:
    return Issue(
        error.code,
        str(error) if isinstance(error, RowError) else error.message,
        entry.file,
        entry.row,
        error.field,
        entry.original,
    )


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


def _expectation_frame(entries: list[Entry]) -> pd.DataFrame:
    columns: dict[str, list[Any]] = {
        name: [] for name in ("kind", "prompt", "chosen", "rejected", "completion")
    }
    scores = []
    for entry in entries:
        record = entry.record
        for name in columns:
            columns[name].append(as_text(record.get(name)) if name != "kind" else str(record["kind"]))
        scores.append(record.get("score"))
    frame = pd.DataFrame(columns, dtype=object)
    frame["score"] = (
        pd.array(scores, dtype="Float64").astype("float64") if entries else pd.Series(dtype=float)
    )
    return frame


def _apply_expectations(
    entries: list[Entry], config: DataConfig, issues: list[Issue]
) -> tuple[list[Entry], list[dict[str, Any]]]:
    if not entries:
        return entries, []
    failures, summary = run_expectations(_expectation_frame(entries), config.max_chars)
    first: dict[int, Any] = {}
    for failure in sorted(failures, key=lambda f: f.index):
        first.setdefault(failure.index, failure)
    issues.extend(_entry_issue(first[i], entries[i]) for i in sorted(first))
    return [e for i, e in enumerate(entries) if i not in first], summary


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
    """Run every check over already-read rows (used by :func:`validate_paths` and the bench)."""
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


def validate_dataset(
    paths: str | Path | list[str | Path],
    config: DataConfig | None = None,
    report_path: str | Path | None = None,
    fmt: str | None = None,
) -> ValidationResult:
    """Validate input files and (optionally) write the JSON report; returns counts only."""
    validated = validate_paths(paths, config, fmt)
    if report_path is not None:
        write_report(validated.report, report_path)
    return summarize(validated, report_path)


def summarize(validated: Validated, report_path: str | Path | None = None) -> ValidationResult:
    return summarize_report(validated.report, report_path)


def summarize_report(report: dict[str, Any], report_path: str | Path | None = None) -> ValidationResult:
    """The counts and one-line summary of a report (fresh or read back from a snapshot)."""
    return ValidationResult(
        passed=report["passed"],
        exit_code=exit_code(report),
        input_rows=report["input_rows"],
        kept=report["kept"],
        quarantined=report["quarantined"],
        bad_fraction=report["bad_fraction"],
        counts_by_reason=report["counts_by_reason"],
        report_path=str(report_path) if report_path else None,
        summary=format_summary(report),
    )


def quarantine_rows(issues: list[Issue]) -> list[dict[str, Any]]:
    """Quarantine table rows: the original row as JSON plus file, row, reason and message."""
    return [
        {**issue.to_dict(), "original": json.dumps(issue.original, ensure_ascii=True, default=str)}
        for issue in issues
    ]


__all__ = [
    "TEXT_FIELDS",
    "Entry",
    "ValidationResult",
    "Validated",
    "exit_code",
    "quarantine_rows",
    "summarize",
    "summarize_report",
    "validate_dataset",
    "validate_paths",
    "validate_rows",
]
