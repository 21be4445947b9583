"""Validation: read -> normalise -> row checks -> great-expectations -> cross-row checks -> report.

Every input row comes out either kept (with its file, row and any user-supplied split) or
as an :class:`Issue` bound for quarantine, so ``kept + quarantined == input rows`` holds by
construction and is written into the report.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from alignflow.data.checks import (
    KEY_SEPARATOR,
    TEXT_FIELDS,
    SeenKeys,
    as_text,
    check_record,
    control_messages,
    hash_keys,
    hashable,
    label_imbalance,
    near_key_column,
    pair_tag,
    record_keys,
    text_problems,
)
from alignflow.data.config import DataConfig
from alignflow.data.expectations import run_expectations
from alignflow.data.issues import UNREADABLE_FILE_REASONS, Issue, Reason
from alignflow.data.normalize import DEFAULT_MAPPING, RESERVED_COLUMNS, RowError, normalize_row
from alignflow.data.readers import (
    RawRow,
    TableBlock,
    input_files,
    prefetched,
    read_items,
)
from alignflow.data.report import build_report, format_summary, write_report
from alignflow.data.schema import RecordKind
from alignflow.data.split import prompt_key


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
        try:
            files = input_files(path, fmt)
        except ValueError:  # a file given by name whose format cannot be told: the reader says so
            files = [(path, None)]
        for file, file_fmt in files:
            inputs.append({"path": str(file), "format": file_fmt, "sha256": file_sha256(file)})
    return inputs


def skipped_file_warnings(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A warning per file of a directory that was not read: its format could not be told."""
    return [
        {
            "code": str(Reason.FILE_SKIPPED),
            "file": item["path"],
            "message": f"{item['path']}: not read (not JSONL, JSON, Parquet, CSV or TSV by name or content)",
        }
        for item in inputs
        if item["format"] is None and item["sha256"] is not None
    ]


def load_tokenizer(config: DataConfig):
    if not config.tokenizer:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.tokenizer)


def _entry_issue(error: RowError | Any, entry: Entry) -> Issue:
    return Issue(
        error.code,
        str(error) if isinstance(error, RowError) else error.message,
        entry.file,
        entry.row,
        error.field,
        entry.original,
    )


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


# What great-expectations reports, in its order, when no row fails (the suite runs only on
# rows that could fail it; see _may_fail_expectations). tests/data check this against GX.
CLEAN_EXPECTATIONS = [
    ("expect_column_to_exist", "kind"),
    ("expect_column_values_to_be_in_set", "kind"),
    *(
        (expectation, column)
        for column in ("prompt", "chosen", "rejected", "completion")
        for expectation in (
            "expect_column_to_exist",
            "expect_column_values_to_not_be_null",
            "expect_column_value_lengths_to_be_between",
        )
    ),
    ("expect_column_to_exist", "score"),
    ("expect_column_values_to_not_be_null", "score"),
    ("expect_column_values_to_be_between", "score"),
]
_KINDS = {str(kind) for kind in RecordKind}
_PAIR_TEXT = TEXT_FIELDS["pair"]
# columns that change how a row with prompt/chosen/rejected is read: such blocks go row by row
_BULK_COLUMNS = {"prompt", "chosen", "rejected", "id", "source", "metadata"}
BATCH_ROWS = 50_000  # rows checked together: arrays stay in cache, memory stays bounded
_ROW_BITS = 40  # a row's place packed in one int64: file index << 40 | row + 1


def _may_fail_expectations(record: dict[str, Any], max_chars: int) -> bool:
    """True for every record the GX suite could refuse (nulls, score range, lengths): a superset."""
    kind = str(record["kind"])
    if kind not in _KINDS or record.get("prompt") is None:
        return True
    if kind == "pair" and (record.get("chosen") is None or record.get("rejected") is None):
        return True
    if kind == "scored" and (record.get("completion") is None or record.get("score") is None):
        return True
    score = record.get("score")
    if score is not None and not 0.0 <= score <= 1.0:
        return True
    return any(
        (value := record.get(f)) is not None and len(as_text(value)) > max_chars
        for f in ("prompt", "chosen", "rejected", "completion")
    )


@dataclass
class _Bulk:
    """The bulk-read rows of one batch: their text columns joined across blocks."""

    blocks: list[TableBlock]
    texts: list  # prompt, chosen, rejected: pyarrow string arrays over every bulk row
    segment: np.ndarray  # block of each row
    offset: np.ndarray  # row inside its block
    positions: np.ndarray  # place in the batch
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # still candidates

    def raw(self, k: int) -> RawRow:
        return self.blocks[self.segment[k]].raw(int(self.offset[k]))

    def where(self, k: int) -> tuple[str, int]:
        block = self.blocks[self.segment[k]]
        return block.file, int(block.rows[self.offset[k]])

    def places(self, ks: np.ndarray) -> tuple[list[str], list[int]]:
        """File and line of many rows at once."""
        files = [block.file for block in self.blocks]
        lines = np.concatenate([block.rows for block in self.blocks])  # in block order, as ks index
        return [files[s] for s in self.segment[ks].tolist()], lines[ks].tolist()


class _Run:
    """One validation, fed in batches: read -> normalise/check -> GX -> duplicates -> leakage.

    Bulk rows (:class:`TableBlock`) are checked column-wise; a row any bulk check doubts,
    and every row that is not a plain text pair, goes through the row-by-row path
    (``normalize_row`` + ``check_record``), so verdicts and messages are the old ones.
    Issues are kept per phase and joined at the end in the old order. With
    ``keep=False`` no record is kept: memory is one batch plus 24 bytes per distinct row.
    """

    def __init__(self, config: DataConfig, tokenizer: Any, keep: bool):
        self.config, self.tokenizer, self.keep = config, tokenizer, keep
        self.mapping = config.column_mapping
        mapped = {source.split(".")[0] for source in self.mapping}  # a dotted source reads its column
        self.blocked = (RESERVED_COLUMNS - _BULK_COLUMNS) | set(DEFAULT_MAPPING) | mapped
        self.files: list[str] = []
        self.file_ids: dict[str, int] = {}
        self.input_rows = 0
        self.phases: tuple[list[Issue], ...] = ([], [], [])  # read/normalise, GX, duplicates
        self.seen = SeenKeys()
        self.entries: list[Entry] = []
        self.kept = 0
        self.kinds: Counter = Counter()
        self.labels: list[bool | None] = []  # None: dropped (its eval prompt leaked into train)
        self.train_prompts: set[int] = set()
        self.eval_rows: list[tuple[int, str, int | None, Any]] = []
        self.summary: dict[tuple[str, str], dict[str, Any]] | None = None
        self.any_candidate = False

    # --- helpers ---------------------------------------------------------------------
    def _where(self, file: str, row: int | None) -> int:
        if file not in self.file_ids:
            self.file_ids[file] = len(self.files)
            self.files.append(file)
        return (self.file_ids[file] << _ROW_BITS) | (0 if row is None else row + 1)

    def _place(self, packed: int) -> str:
        row = (packed & ((1 << _ROW_BITS) - 1)) - 1
        return f"{self.files[packed >> _ROW_BITS]}:{None if row < 0 else row}"

    def normalize(self, data: dict[str, Any]) -> dict[str, Any]:
        """One row as a canonical record under the config's column mapping, label coding and score scale."""
        config = self.config
        return normalize_row(
            data, self.mapping, config.preferred_values, config.score_range, config.response_fields
        )

    def _issue(self, code: Reason, message: str, raw: RawRow, field_name: str | None) -> Issue:
        return Issue(code, message, raw.file, raw.row, field_name, raw.data if self.keep else None)

    def _bulk_texts(self, block: TableBlock) -> list | None:
        """The block's prompt/chosen/rejected columns when its rows can be checked in bulk.

        That is: plain text pairs, no column that changes how the row is read (mapping,
        margin, label, other shapes) and no tokenizer check.
        """
        import pyarrow as pa

        columns = set(block.table.column_names)
        if self.tokenizer is not None and self.config.max_tokens is not None:
            return None
        if not set(_PAIR_TEXT) <= columns or columns & self.blocked:
            return None
        texts = []
        for name in _PAIR_TEXT:
            column = block.table.column(name)
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                return None
            texts.append(column.combine_chunks().cast(pa.string()))
        return texts

    # --- one batch -------------------------------------------------------------------
    def batch(self, items: list[Any]) -> None:
        import pyarrow as pa

        read_issues: list[tuple[int, Issue]] = []
        slow: list[tuple[int, RawRow, dict[str, Any]]] = []
        blocks: list[TableBlock] = []
        parts: list[list] = [[], [], []]
        segment, offset, positions = [], [], []
        position = 0

        def by_row(pos: int, raw: RawRow) -> None:
            if raw.issue is not None:
                if not self.keep:
                    raw.issue.original = None
                read_issues.append((pos, raw.issue))
                return
            try:
                record = self.normalize(raw.data)
                check_record(record, self.tokenizer, self.config.max_tokens, self.config.max_chars)
            except RowError as error:
                read_issues.append((pos, self._issue(error.code, str(error), raw, error.field)))
                return
            slow.append((pos, raw, record))

        for item in items:
            if not isinstance(item, TableBlock):
                by_row(position, item)
                position += 1
                continue
            # the block's parsed rows and its odd lines, placed in line order
            n_rows = len(item.rows)
            lines = np.concatenate((item.rows, np.array([e.row for e in item.extra], np.int64)))
            place = np.empty(len(lines), np.int64)
            place[np.argsort(lines, kind="stable")] = np.arange(len(lines)) + position
            for j, extra in enumerate(item.extra):
                by_row(int(place[n_rows + j]), extra)
            texts = self._bulk_texts(item)
            if texts is None:
                for i in range(n_rows):
                    by_row(int(place[i]), item.raw(i))
            else:
                for part, text in zip(parts, texts, strict=True):
                    part.append(text)
                segment.append(np.full(n_rows, len(blocks), np.int64))
                offset.append(np.arange(n_rows, dtype=np.int64))
                positions.append(place[:n_rows])
                blocks.append(item)
            position += len(item)
        self.input_rows += position

        bulk = None
        if blocks:
            texts = [pa.concat_arrays(part) for part in parts]
            places = [np.concatenate(part) for part in (segment, offset, positions)]
            bulk = _Bulk(blocks, texts, *places)
            ok = self._bulk_row_checks(bulk, read_issues, by_row)
            bulk.rows = np.flatnonzero(ok)
        read_issues.sort(key=lambda pair: pair[0])
        self.phases[0].extend(issue for _, issue in read_issues)
        if (bulk is not None and len(bulk.rows)) or slow:
            self.any_candidate = True
        slow = self._expectations(bulk, slow)
        self._dedupe(bulk, slow)

    def _bulk_row_checks(self, bulk: _Bulk, read_issues: list, by_row) -> np.ndarray:
        """check_record over whole columns; returns the rows that pass.

        A flagged row whose three texts are present gets check_record's first error
        (fields in order: empty, control character; then chosen == rejected); a row
        missing one goes down the row-by-row path (implicit prompts, missing fields).
        """
        import pyarrow.compute as pc

        problems = [text_problems(text) for text in bulk.texts]
        same = pc.fill_null(pc.equal(bulk.texts[1], bulk.texts[2]), False)
        same = np.asarray(same.to_numpy(zero_copy_only=False), bool)
        ok = ~same
        for blank, control in problems:
            ok &= ~(blank | control)
        nulls = np.zeros(len(ok), bool)
        for text in bulk.texts:
            if text.null_count:
                nulls |= np.asarray(text.is_null().to_numpy(zero_copy_only=False), bool)
        for k in np.flatnonzero(nulls).tolist():
            by_row(int(bulk.positions[k]), bulk.raw(k))
        flagged = np.flatnonzero(~ok & ~nulls)
        if not len(flagged):
            return ok
        # check_record's first error: fields in order (empty, then control), then chosen == rejected
        codes = np.full(len(flagged), 2, np.int8)  # 0 empty, 1 control, 2 chosen == rejected
        fields = np.zeros(len(flagged), np.int8)
        for i, (blank, control) in enumerate(reversed(problems)):  # earlier fields overwrite later ones
            column = len(problems) - 1 - i
            for code, mask in ((1, control[flagged]), (0, blank[flagged])):
                codes[mask], fields[mask] = code, column
        messages = np.empty(len(flagged), object)
        messages[codes == 2] = "chosen and rejected are identical"
        fields[codes == 2] = 1
        for column, name in enumerate(_PAIR_TEXT):
            messages[(codes == 0) & (fields == column)] = f"{name!r} is empty"
            at = np.flatnonzero((codes == 1) & (fields == column))
            if len(at):
                messages[at] = control_messages(bulk.texts[column], flagged[at], name)
        reasons = (Reason.EMPTY_FIELD, Reason.CONTROL_CHARS, Reason.CHOSEN_EQUALS_REJECTED)
        files, rows = bulk.places(flagged)
        for j, k in enumerate(flagged.tolist()):
            original = bulk.raw(k).data if self.keep else None
            issue = Issue(reasons[codes[j]], messages[j], files[j], rows[j], _PAIR_TEXT[fields[j]], original)
            read_issues.append((int(bulk.positions[k]), issue))
        return ok

    def _expectations(self, bulk: _Bulk | None, slow: list) -> list[tuple[int, RawRow, dict[str, Any]]]:
        """great-expectations on the rows that could fail it; the rest pass without a GX call."""
        import pyarrow.compute as pc

        max_chars = self.config.max_chars
        suspects: list[tuple[int, Entry]] = []
        if bulk is not None and len(bulk.rows):
            long = np.zeros(len(bulk.rows), bool)
            for text in bulk.texts:
                lengths = pc.utf8_length(text.take(bulk.rows))
                long |= np.asarray(lengths.to_numpy(zero_copy_only=False)) > max_chars
            for k in bulk.rows[long].tolist():
                raw = bulk.raw(k)
                record = self.normalize(raw.data)
                entry = Entry(record, raw.file, raw.row, raw.split, raw.data)
                suspects.append((int(bulk.positions[k]), entry))
            bulk.rows = bulk.rows[~long]
        remaining = []
        for pos, raw, record in slow:
            if _may_fail_expectations(record, max_chars):
                suspects.append((pos, Entry(record, raw.file, raw.row, raw.split, raw.data)))
            else:
                remaining.append((pos, raw, record))
        if suspects:
            suspects.sort(key=lambda pair: pair[0])
            found: list[Issue] = []
            passed, summary = _apply_expectations([entry for _, entry in suspects], self.config, found)
            self._merge_summary(summary)
            if not self.keep:
                for issue in found:
                    issue.original = None
            self.phases[1].extend(found)
            passed_ids = {id(entry) for entry in passed}
            remaining += [
                (pos, RawRow(e.file, e.row, e.original, e.split), e.record)
                for pos, e in suspects
                if id(e) in passed_ids
            ]
        remaining.sort(key=lambda item: item[0])
        return remaining

    def _merge_summary(self, summary: list[dict[str, Any]]) -> None:
        if self.summary is None:
            self.summary = {}
        for item in summary:
            key = (item["expectation"], item["column"])
            if key in self.summary:
                self.summary[key]["unexpected"] += item["unexpected"]
                self.summary[key]["success"] = self.summary[key]["success"] and item["success"]
            else:
                self.summary[key] = dict(item)

    def _dedupe(self, bulk: _Bulk | None, slow: list[tuple[int, RawRow, dict[str, Any]]]) -> None:
        import pyarrow.compute as pc

        exact: list[np.ndarray] = []
        near: list[np.ndarray] = []
        positions, where, source = [], [], []
        tag, sep = pair_tag(), KEY_SEPARATOR
        if bulk is not None and len(bulk.rows):
            texts = [text.take(bulk.rows) for text in bulk.texts]
            folded = [near_key_column(text) for text in texts]
            for keys, columns in ((exact, texts), (near, folded)):
                joined = pc.binary_join_element_wise(*columns, tag, sep)
                keys.append(hash_keys(joined.to_numpy(zero_copy_only=False)))
            file_bits = np.array([self._where(b.file, 0) >> _ROW_BITS for b in bulk.blocks], np.int64)
            block_rows = np.concatenate([b.rows for b in bulk.blocks])  # line numbers, block order
            where.append((file_bits[bulk.segment[bulk.rows]] << _ROW_BITS) | (block_rows[bulk.rows] + 1))
            positions.append(bulk.positions[bulk.rows])
            source.append(bulk.rows)
        if slow:
            slow_keys = [record_keys(record) for _, _, record in slow]
            exact.append(hash_keys(np.array([k[0] for k in slow_keys], dtype=object)))
            near.append(hash_keys(np.array([k[1] for k in slow_keys], dtype=object)))
            where.append(np.array([self._where(raw.file, raw.row) for _, raw, _ in slow], np.int64))
            positions.append(np.array([pos for pos, _, _ in slow], np.int64))
            source.append(-1 - np.arange(len(slow), dtype=np.int64))  # negative: index into slow
        if not positions:
            return
        order = np.argsort(np.concatenate(positions), kind="stable")
        exact_h, near_h = np.concatenate(exact)[order], np.concatenate(near)[order]
        where_a, source_a = np.concatenate(where)[order], np.concatenate(source)[order]
        verdict, first = self.seen.check(near_h, exact_h, where_a)

        def row_of(k: int) -> tuple[RawRow, dict[str, Any] | None]:
            if source_a[k] < 0:
                _, raw, record = slow[-1 - source_a[k]]
                return raw, record
            assert bulk is not None  # a source >= 0 is a bulk row
            return bulk.raw(int(source_a[k])), None

        duplicates = np.flatnonzero(verdict)
        from_bulk = source_a[duplicates] >= 0
        files, lines = (  # rows from the bulk (source >= 0) imply a bulk
            bulk.places(source_a[duplicates[from_bulk]]) if bulk is not None and from_bulk.any() else ([], [])
        )
        at_bulk = iter(range(len(files)))
        for k in duplicates.tolist():
            place = self._place(int(first[k]))
            if verdict[k] == 1:
                code, message = Reason.DUPLICATE_EXACT, f"same content as {place}"
            else:
                code, message = Reason.DUPLICATE_NEAR, f"same text up to case/spacing/punctuation as {place}"
            if source_a[k] < 0:
                raw = slow[-1 - source_a[k]][1]
                self.phases[2].append(self._issue(code, message, raw, "prompt"))
            else:
                assert bulk is not None  # a source >= 0 is a bulk row
                j = next(at_bulk)
                original = bulk.raw(int(source_a[k])).data if self.keep else None
                self.phases[2].append(Issue(code, message, files[j], lines[j], "prompt", original))
        self._keep(np.flatnonzero(verdict == 0), source_a, slow, row_of, bulk)

    def _keep(self, kept, source_a, slow, row_of, bulk: _Bulk | None) -> None:
        """Count kept rows (kinds, KTO labels, user splits) and, with ``keep``, keep their records."""
        self.kept += len(kept)
        from_slow = source_a[kept] < 0
        self.kinds["pair"] += int((~from_slow).sum())
        label_index: dict[int, int] = {}
        for k in kept[from_slow].tolist():
            _, raw, record = slow[-1 - source_a[k]]
            self.kinds[str(record["kind"])] += 1
            if record["kind"] == "unpaired":
                label_index[k] = len(self.labels)
                self.labels.append(record["label"])
        if self.keep:
            for k in kept.tolist():
                raw, record = row_of(k)
                record = record if record is not None else self.normalize(raw.data)
                self.entries.append(Entry(record, raw.file, raw.row, raw.split, raw.data))
        bulk_split = bulk is not None and any(b.split for b in bulk.blocks)
        if not bulk_split and not any(raw.split for _, raw, _ in slow):
            return
        for k in kept.tolist():  # user-supplied splits: rare, so row by row
            raw, record = row_of(k)
            if not raw.split:
                continue
            record = record if record is not None else self.normalize(raw.data)
            key = int(hash_keys(np.array([hashable(prompt_key(record["prompt"]))], dtype=object))[0])
            if raw.split == "train":
                self.train_prompts.add(key)
            elif raw.split == "eval":
                self.eval_rows.append((key, str(record["kind"]), label_index.get(k), raw))

    # --- the end ---------------------------------------------------------------------
    def finish(self, inputs: list[dict[str, Any]]) -> Validated:
        leaks: list[Issue] = []
        leaked_rows = set()
        for key, kind, label_at, raw in self.eval_rows:
            if key in self.train_prompts:
                message = "this eval prompt also appears in the train split"
                leaks.append(self._issue(Reason.PROMPT_LEAKAGE, message, raw, "prompt"))
                leaked_rows.add((raw.file, raw.row))
                self.kept -= 1
                self.kinds[kind] -= 1
                if label_at is not None:
                    self.labels[label_at] = None
        if leaked_rows and self.keep:
            self.entries = [
                e for e in self.entries if not (e.split == "eval" and (e.file, e.row) in leaked_rows)
            ]
        issues = [*self.phases[0], *self.phases[1], *self.phases[2], *leaks]
        if not self.any_candidate:
            summary: list[dict[str, Any]] = []
        else:
            seen = self.summary or {}
            summary = [
                seen.get(key) or {"expectation": key[0], "column": key[1], "success": True, "unexpected": 0}
                for key in CLEAN_EXPECTATIONS
            ]
        labels = [label for label in self.labels if label is not None]
        imbalance = label_imbalance(labels, self.config.max_label_fraction)
        report = build_report(
            inputs=inputs,
            input_rows=self.input_rows,
            kept=self.kept,
            issues=issues,
            warnings=[
                *([{"code": str(Reason.LABEL_IMBALANCE), "message": imbalance}] if imbalance else []),
                *skipped_file_warnings(inputs),
            ],
            expectations=summary,
            kinds=+self.kinds,
            max_bad_fraction=self.config.max_bad_fraction,
            unreadable=sorted({i.file for i in issues if i.code in UNREADABLE_FILE_REASONS}),
            truncated=sorted({i.file for i in issues if i.code == Reason.FILE_TRUNCATED}),
        )
        return Validated(self.entries, issues, report)


def validate_rows(
    rows: Iterable[RawRow | TableBlock],
    config: DataConfig,
    inputs: list[dict[str, Any]] | None = None,
    tokenizer: Any = None,
    keep_records: bool = True,
) -> Validated:
    """Run every check over rows (RawRows, or TableBlocks from bulk reading), a batch at a time.

    ``keep_records=False`` keeps no record (``Validated.kept`` stays empty; the report still
    counts them): what streaming a file larger than memory needs.
    """
    run = _Run(config, tokenizer, keep_records)
    batch: list[Any] = []
    size = 0
    for item in rows:
        batch.append(item)
        size += len(item) if isinstance(item, TableBlock) else 1
        if size >= BATCH_ROWS:
            run.batch(batch)
            batch, size = [], 0
    if batch:
        run.batch(batch)
    return run.finish(inputs or [])


def validate_paths(
    paths: str | Path | list[str | Path],
    config: DataConfig | None = None,
    fmt: str | None = None,
    tokenizer: Any = None,
    keep_records: bool = True,
) -> Validated:
    """Read every path (files, plain directories, ``datasets`` directories) and validate the rows.

    JSONL is read in blocks and checked column-wise; see :func:`validate_rows`.
    """
    config = config or DataConfig()
    files = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    fmt = fmt or config.format
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)

    def rows() -> Iterator[Any]:
        for path in files:
            yield from read_items(path, fmt, hint_splits=path.is_dir())

    # the inputs' sha256 (for the report) is read in a thread while the rows are checked
    with ThreadPoolExecutor(1, thread_name_prefix="alignflow-sha256") as pool:
        inputs = pool.submit(describe_inputs, files, fmt)
        validated = validate_rows(prefetched(rows()), config, None, tokenizer, keep_records)
        validated.report["inputs"] = inputs.result()
    validated.report["warnings"] += skipped_file_warnings(validated.report["inputs"])
    return validated


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


def write_full_report(validated: Validated, path: str | Path) -> Path:
    """The report with every quarantined row listed under ``quarantined_rows`` (one per line)."""
    from alignflow.data.report import write_report

    return write_report({**validated.report, "quarantined_rows": validated.issues}, path)


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
