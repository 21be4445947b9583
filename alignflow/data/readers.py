"""Read preference data from JSONL, JSON, Parquet, CSV, TSV, gzip of these and ``datasets`` dirs.

Readers never raise on bad content: each input row comes back as a :class:`RawRow`, and a
line or file that cannot be decoded comes back as a row carrying an :class:`Issue`. That
is what lets validation promise that every input row is accounted for.

Text is decoded with ``surrogateescape`` so that invalid UTF-8 survives as lone surrogates;
the checks then name the row instead of the whole file failing to decode.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from alignflow.data.issues import Issue, Reason
from alignflow.errors import InputError

FORMATS = ("jsonl", "json", "parquet", "csv", "tsv", "datasets")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
}
_GZIP_MAGIC = b"\x1f\x8b"
# Excel and Windows tools start UTF-8 text files with a byte-order mark; it is not part of the data
_UTF8_BOM = b"\xef\xbb\xbf"
# a cell beyond the csv module's 128 KiB default is still a row: the length checks judge it and
# name its row, where the cap would make the record unreadable
csv.field_size_limit(2**31 - 1)
_SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "eval": "eval",
    "test": "eval",
    "validation": "eval",
    "valid": "eval",
    "dev": "eval",
}


class FormatError(InputError):
    """The input's format cannot be determined or is not supported (a usage error)."""


@dataclass
class RawRow:
    """One input row: where it came from, its fields (None when unreadable) and any read issue."""

    file: str
    row: int | None
    data: Any
    split: str | None = None
    issue: Issue | None = None


def is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


def is_datasets_dir(path: Path) -> bool:
    markers = ("dataset_dict.json", "dataset_info.json", "state.json")
    return path.is_dir() and any((path / m).exists() for m in markers)


def detect_format(path: str | Path) -> str:
    """The reader for ``path``: by suffix (ignoring ``.gz``), else by sniffing the first bytes."""
    path = Path(path)
    if is_datasets_dir(path):
        return "datasets"
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] in _SUFFIX_FORMATS:
        return _SUFFIX_FORMATS[suffixes[-1]]
    return _sniff(path)


def _sniff(path: Path) -> str:
    try:
        head = _open_binary(path).read(512)
    except (OSError, EOFError, zlib.error) as exc:
        raise FormatError(f"{path}: cannot read to detect its format: {exc}") from exc
    if head.startswith(b"PAR1"):
        return "parquet"
    stripped = without_bom(head).lstrip()
    if stripped.startswith(b"["):
        return "json"
    if stripped.startswith(b"{"):
        return "jsonl"
    raise FormatError(f"{path}: cannot detect the format; pass --format one of {', '.join(FORMATS)}")


def _open_binary(path: Path):
    """The file's bytes (gunzipped), as UTF-8: a UTF-16/32 file, which Windows tools write
    (PowerShell's ``>``, Excel's "Unicode Text"), is transcoded by its byte-order mark, where
    read as UTF-8 every one of its lines would be "invalid JSON"."""
    fh = gzip.open(path, "rb") if is_gzip(path) else path.open("rb")  # noqa: SIM115 - the caller closes it
    encoding = _wide_encoding(fh.read(4))
    fh.seek(0)
    if encoding is None:
        return fh
    with fh:
        return io.BytesIO(fh.read().decode(encoding, errors="replace").encode("utf-8"))


def _wide_encoding(head: bytes) -> str | None:
    """'utf-32' or 'utf-16' when ``head`` starts with their byte-order mark (32 first: its
    little-endian mark begins with UTF-16's)."""
    if head.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        return "utf-32"
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    return None


def without_bom(data: bytes) -> bytes:
    """``data`` without a leading UTF-8 byte-order mark."""
    return data[len(_UTF8_BOM) :] if data.startswith(_UTF8_BOM) else data


def _read_text(file: Path) -> str:
    with _open_binary(file) as fh:
        return without_bom(fh.read()).decode("utf-8", errors="surrogateescape")


def split_hint(path: Path) -> str | None:
    """A user-supplied split from a file name such as ``train.jsonl`` or ``test-00000.parquet``."""
    stem = path.name.split(".")[0].lower()
    for part in stem.replace("_", "-").split("-"):
        if part in _SPLIT_ALIASES:
            return _SPLIT_ALIASES[part]
    return None


def input_files(path: Path, fmt: str | None = None) -> list[tuple[Path, str | None]]:
    """Each file of ``path`` with the reader for it (``fmt``, else detected).

    A file given by name must have a format that can be told (else :class:`FormatError`).
    Of a plain directory, every file is listed in sorted (deterministic) order, and one whose
    format cannot be told comes with None: a README, a licence or a script beside the data
    (as in a Hugging Face dataset download) is not data, so readers skip it and validation
    reports it as a ``file_skipped`` warning.
    """
    if not path.is_dir() or is_datasets_dir(path):
        return [(path, fmt or detect_format(path))]
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [(file, fmt or _format_or_none(file)) for file in files]


def _format_or_none(file: Path) -> str | None:
    try:
        return detect_format(file)
    except FormatError:
        return None


def read_rows(path: str | Path, fmt: str | None = None, hint_splits: bool = False) -> Iterator[RawRow]:
    """Every row of ``path`` (a file or directory); read errors come back as rows with an issue."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise FormatError(f"--format {fmt}: unknown format; choose one of {', '.join(FORMATS)}")
    if not path.exists():
        yield RawRow(
            str(path), None, None, issue=Issue(Reason.FILE_NOT_FOUND, "no such file or directory", str(path))
        )
        return
    for file, file_fmt in input_files(path, fmt):
        if file_fmt is not None:  # None: not a data file (see input_files)
            split = split_hint(file) if hint_splits else None
            yield from _read_file(file, file_fmt, split)


def _read_file(file: Path, fmt: str, split: str | None, bulk: bool = False) -> Iterator[RawRow]:
    name = str(file)
    count = 0
    reader = _read_jsonl_blocks if bulk and fmt == "jsonl" else _READERS[fmt]
    try:
        for row in reader(file, split):
            count += len(row) if isinstance(row, TableBlock) else 1
            yield row
    except (EOFError, zlib.error) as exc:
        yield RawRow(
            name,
            count + 1,
            None,
            split,
            Issue(Reason.FILE_TRUNCATED, f"file ends early after {count} rows: {exc}", name, count + 1),
        )
        return
    except Exception as exc:  # noqa: BLE001 - any reader failure is reported, never a traceback
        yield RawRow(
            name,
            None,
            None,
            split,
            Issue(Reason.FILE_UNREADABLE, f"cannot read as {fmt}: {type(exc).__name__}: {exc}", name),
        )
        return
    if count == 0:
        yield RawRow(name, None, None, split, Issue(Reason.FILE_EMPTY, "the file holds no rows", name))


def _decode_json_line(name: str, number: int, raw: bytes, split: str | None) -> RawRow:
    # without its line end: a line cut off mid-object is then reported where it stops (the
    # column Python's parser gives for the line alone), not at column 1 of the next line
    text = raw.decode("utf-8", errors="surrogateescape").rstrip("\r\n")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return RawRow(
            name,
            number,
            None,
            split,
            Issue(
                Reason.INVALID_JSON,
                f"invalid JSON: {exc.msg} at column {exc.colno}",
                name,
                number,
                original=text[:2000],
            ),
        )
    if not isinstance(data, dict):
        return RawRow(
            name,
            number,
            None,
            split,
            Issue(
                Reason.NOT_AN_OBJECT,
                f"expected a JSON object, got {type(data).__name__}",
                name,
                number,
                original=data,
            ),
        )
    return RawRow(name, number, data, split)


def _read_jsonl(file: Path, split: str | None) -> Iterator[RawRow]:
    name = str(file)
    with _open_binary(file) as fh:
        for number, raw in enumerate(fh, start=1):
            raw = without_bom(raw) if number == 1 else raw
            if raw.strip():
                yield _decode_json_line(name, number, raw, split)


def _read_json(file: Path, split: str | None) -> Iterator[RawRow]:
    name = str(file)
    data = json_records(json.loads(_read_text(file)))
    for number, item in enumerate(data, start=1):
        if isinstance(item, dict):
            yield RawRow(name, number, item, split)
        else:
            yield RawRow(
                name,
                number,
                None,
                split,
                Issue(
                    Reason.NOT_AN_OBJECT,
                    f"expected an object, got {type(item).__name__}",
                    name,
                    number,
                    original=item,
                ),
            )


def json_records(data: Any) -> list:
    """The records of a JSON document: a list; an object holding one list (``{"data": [...]}``,
    pandas' ``orient="table"``); or pandas' other layouts of a frame: ``"split"`` (columns
    and rows of values), ``"index"`` (``{id: record}``) and ``"columns"``, what
    ``DataFrame.to_json()`` writes by default (``{column: {id: value}}``)."""
    if isinstance(data, list):
        return data
    if not isinstance(data, dict):
        raise ValueError("expected a list of records")
    columns, rows = data.get("columns"), data.get("data")
    if isinstance(columns, list) and isinstance(rows, list):  # orient="split"
        return [dict(zip(columns, r, strict=True)) if _row_of(r, columns) else r for r in rows]
    lists = [v for v in data.values() if isinstance(v, list)]
    if len(lists) == 1:
        return lists[0]
    if data and all(isinstance(v, dict) for v in data.values()):
        if all(str(k).isdigit() for v in data.values() for k in v):  # {column: {row id: value}}
            ids = list(dict.fromkeys(k for v in data.values() for k in v))
            return [{column: values.get(i) for column, values in data.items()} for i in ids]
        return list(data.values())  # {row id: record}
    raise ValueError("a JSON object must hold one list of records (e.g. {'data': [...]}) or a pandas frame")


def _row_of(row: Any, columns: list) -> bool:
    return isinstance(row, list) and len(row) == len(columns)


@dataclass
class _CsvRecord:
    line: int  # the physical line the record starts on
    cells: list[str] | None  # None when the record is not valid CSV
    error: str = ""
    text: str = ""  # the record's first line, kept for the quarantine when it is malformed


def _csv_records(text: str, delimiter: str = ",") -> Iterator[_CsvRecord]:
    """The non-blank records of ``text``, parsed strictly.

    A lenient parse lets an unbalanced quote swallow every line up to the next quote (or the
    end of the file) into one cell, so rows vanish into their neighbour. Strictly, that is an
    error: the record is reported as malformed and reading resumes on the line after its first,
    so the rows it would have swallowed are still read.
    """
    lines = io.StringIO(text, newline="").readlines()
    start = 0
    while start < len(lines):
        # from line `start` on without copying the list: a file with many bad records restarts often
        reader = csv.reader((lines[i] for i in range(start, len(lines))), delimiter=delimiter, strict=True)
        consumed = 0
        try:
            for cells in reader:
                first, consumed = start + consumed + 1, reader.line_num
                if cells:
                    yield _CsvRecord(first, cells)
            return
        except csv.Error as exc:
            first = start + consumed + 1
            yield _CsvRecord(first, None, str(exc), lines[first - 1].rstrip("\r\n"))
            start = first


def _read_csv(file: Path, split: str | None, delimiter: str | None = None) -> Iterator[RawRow]:
    name = str(file)
    text = _read_text(file)
    records = _csv_records(text, delimiter or header_delimiter(text))
    header = next(records, None)
    if header is None:
        return
    if header.cells is None:
        raise ValueError(f"the header (line {header.line}) is not valid CSV: {header.error}")
    columns = header.cells
    for number, record in enumerate(records, start=1):
        if record.cells is None:
            message = (
                f"the record starting at line {record.line} is not valid CSV ({record.error}), "
                f"most likely an unbalanced quote; reading resumed at line {record.line + 1}"
            )
            issue = Issue(Reason.MALFORMED_CSV, message, name, number, original=record.text)
            yield RawRow(name, number, None, split, issue)
            continue
        if len(record.cells) > len(columns):
            extra = record.cells[len(columns) :]
            message = "row has more cells than the header"
            issue = Issue(Reason.UNKNOWN_SHAPE, message, name, number, original=extra)
            yield RawRow(name, number, None, split, issue)
            continue
        row = dict.fromkeys(columns) | dict(zip(columns, record.cells, strict=False))  # short rows: None
        # an empty CSV cell is an absent value, not an empty string
        yield RawRow(name, number, {k: (v if v != "" else None) for k, v in row.items()}, split)


def header_delimiter(text: str) -> str:
    """The separator a CSV's header line uses: a comma, else the semicolon that Excel writes
    where the comma is the decimal mark (German, French...), a tab or a pipe."""
    end = text.find("\n")
    header = text if end < 0 else text[:end]  # no copy of the rest of a large file
    counts = {sep: header.count(sep) for sep in (",", ";", "\t", "|")}
    best = max(counts, key=lambda sep: counts[sep])
    return best if counts[best] > counts[","] else ","


def _read_tsv(file: Path, split: str | None) -> Iterator[RawRow]:
    return _read_csv(file, split, delimiter="\t")


def _read_parquet(file: Path, split: str | None) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    name = str(file)
    source = io.BytesIO(_open_binary(file).read()) if is_gzip(file) else file
    number = 0
    for batch in pq.ParquetFile(source).iter_batches(batch_size=10_000):
        for row in batch.to_pylist():
            number += 1
            yield RawRow(name, number, row, split)


def _read_datasets(file: Path, split: str | None) -> Iterator[RawRow]:
    from datasets import Dataset, DatasetDict, load_from_disk

    name = str(file)
    loaded = load_from_disk(str(file))
    parts: dict[str, Dataset] = dict(loaded) if isinstance(loaded, DatasetDict) else {"": loaded}
    for split_name, dataset in sorted(parts.items()):
        user_split = _SPLIT_ALIASES.get(split_name.lower()) if split_name else split
        label = f"{name}[{split_name}]" if split_name else name
        for number, row in enumerate(dataset, start=1):
            yield RawRow(label, number, row, user_split)


BLOCK_BYTES = 4 << 20  # JSONL bytes parsed per block in bulk reading: bounds memory, stays in cache
_SLOW_RUN = 32  # a run of lines this short that pyarrow refuses goes line by line
_ROW_IN_ERROR = re.compile(r"in row (\d+)")
_OPEN, _CLOSE, _CR, _NL = ord("{"), ord("}"), ord("\r"), ord("\n")


@dataclass
class TableBlock:
    """Consecutive JSONL rows parsed column-wise by pyarrow in one call.

    Only lines that ``json.loads`` reads as the same single object get here: each line
    is one ``{...}`` with no raw control bytes and valid UTF-8, and pyarrow returned
    exactly one row per line. ``raw(i)`` decodes row ``i`` the row-by-row way, for the
    few rows the vectorised checks hand back.
    """

    file: str
    split: str | None
    rows: np.ndarray  # line number of each table row
    table: Any  # pyarrow.Table
    buffer: bytes
    starts: np.ndarray
    ends: np.ndarray  # exclusive, newline included
    # the other lines among these (row by row), so one block is always validated whole
    extra: list[RawRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows) + len(self.extra)

    def raw(self, i: int) -> RawRow:
        line = self.buffer[self.starts[i] : self.ends[i]]
        return _decode_json_line(self.file, int(self.rows[i]), line, self.split)


def read_items(path: str | Path, fmt: str | None = None, hint_splits: bool = False) -> Iterator[Any]:
    """Like :func:`read_rows`, but JSONL comes in :class:`TableBlock` s where it can (bulk reading)."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise FormatError(f"--format {fmt}: unknown format; choose one of {', '.join(FORMATS)}")
    if not path.exists():
        yield from read_rows(path, fmt, hint_splits)
        return
    for file, file_fmt in input_files(path, fmt):
        if file_fmt is not None:
            split = split_hint(file) if hint_splits else None
            yield from _read_file(file, file_fmt, split, bulk=True)


def prefetched(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``items`` produced by a background thread, ``depth`` ahead: pyarrow parses the next
    block (without the GIL) while the caller checks this one. Errors re-raise here."""
    import queue
    import threading

    done = object()
    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                box.put(item)
            box.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            box.put(exc)

    worker = threading.Thread(target=produce, name="alignflow-read", daemon=True)
    worker.start()
    try:
        while (item := box.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                box.get_nowait()
            except queue.Empty:
                worker.join(0.01)


def _read_some(fh, size: int) -> tuple[bytes, BaseException | None]:
    """Up to ``size`` bytes; a gzip that ends early still gives what it decompressed before."""
    parts, total = [], 0
    try:
        while total < size:
            piece = fh.read1(min(size - total, 1 << 20))
            if not piece:
                break
            parts.append(piece)
            total += len(piece)
    except (EOFError, zlib.error) as exc:
        return b"".join(parts), exc
    return b"".join(parts), None


def _read_jsonl_blocks(file: Path, split: str | None) -> Iterator[Any]:
    """JSONL in blocks of whole lines: :class:`TableBlock` s, and RawRows for odd lines."""
    name = str(file)
    carry, first_line = b"", 1
    with _open_binary(file) as fh:
        while True:
            data, error = _read_some(fh, BLOCK_BYTES)
            buffer = carry + data if first_line > 1 or carry else without_bom(data)
            at_end = not data and error is None
            cut = len(buffer) if at_end else buffer.rfind(b"\n") + 1
            if error is not None:  # as line iteration does: the unfinished last line is lost
                cut = buffer.rfind(b"\n") + 1
            if cut > 0:
                block, carry = buffer[:cut], buffer[cut:]
                n_lines, items = _parse_buffer(block, first_line, name, split)
                yield from items
                first_line += n_lines
            else:
                carry = buffer
            if error is not None:
                raise error
            if at_end:
                return


def _line_bounds(buffer: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, end (newline included) and regularity of every line in ``buffer``."""
    arr = np.frombuffer(buffer, np.uint8)
    newlines = np.flatnonzero(arr == _NL)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines + 1, [len(arr)]))
    if starts[-1] == len(arr):  # the buffer ends with a newline: no line after it
        starts, ends = starts[:-1], ends[:-1]
    n = len(starts)
    if n == 0:
        return starts, ends, np.zeros(0, bool)
    # the last byte of the object: before the newline and an optional carriage return
    last = ends - 1
    last = np.where(arr[np.maximum(last, 0)] == _NL, last - 1, last)
    last = np.where((last >= starts) & (arr[np.maximum(last, 0)] == _CR), last - 1, last)
    regular = (last > starts) & (arr[starts] == _OPEN) & (arr[np.maximum(last, 0)] == _CLOSE)
    # raw control bytes (json.loads refuses them inside strings) make a line odd
    control = np.flatnonzero(arr < 0x20)
    control = control[(arr[control] != _NL)]
    if len(control):
        line_of = np.searchsorted(starts, control, side="right") - 1
        is_cr_end = (arr[control] == _CR) & (control == np.minimum(last[line_of] + 1, len(arr) - 1))
        regular[line_of[~is_cr_end]] = False
    # invalid UTF-8 makes a line odd (the row-by-row path names it)
    position = 0
    while position < len(arr):
        try:
            buffer[position:].decode("utf-8")
            break
        except UnicodeDecodeError as exc:
            line = int(np.searchsorted(starts, position + exc.start, side="right") - 1)
            regular[line] = False
            position = int(ends[line])
    return starts, ends, regular


def _parse_buffer(buffer: bytes, first_line: int, name: str, split: str | None) -> tuple[int, list]:
    """Every line of ``buffer`` as TableBlocks (runs of regular lines) or RawRows (the rest)."""
    starts, ends, regular = _line_bounds(buffer)
    whole = _parse_whole(buffer, starts, ends, regular, first_line, name, split)
    if whole is not None:
        return len(starts), [whole]
    items: list[Any] = []
    i, n = 0, len(starts)
    for odd in [*np.flatnonzero(~regular).tolist(), n]:
        if odd > i:
            items.extend(_parse_run(buffer, starts, ends, i, odd, first_line, name, split))
        if odd < n:
            line = buffer[starts[odd] : ends[odd]]
            if line.strip():
                items.append(_decode_json_line(name, first_line + odd, line, split))
        i = odd + 1
    return n, items


def _parse_whole(buffer, starts, ends, regular, first_line, name, split) -> TableBlock | None:
    """The whole buffer in one multi-threaded pyarrow call, odd lines blanked out first.

    None when pyarrow refuses it or its rows do not match the regular lines one to one;
    the caller then narrows down line by line.
    """
    import pyarrow as pa
    import pyarrow.json as pj

    regular_lines = np.flatnonzero(regular)
    if len(regular_lines) <= _SLOW_RUN:
        return None
    odd = np.flatnonzero(~regular)
    source = buffer
    if len(odd):
        blanked = bytearray(buffer)
        for i in odd.tolist():  # keep the newline, so pyarrow sees an empty line
            end = int(ends[i]) - (1 if buffer[ends[i] - 1 : ends[i]] == b"\n" else 0)
            blanked[starts[i] : end] = b" " * (end - int(starts[i]))
        source = bytes(blanked)
    options = pj.ReadOptions(use_threads=True, block_size=max(len(source) // 8, 1 << 20))
    try:
        table = pj.read_json(pa.BufferReader(source), read_options=options)
    except pa.ArrowException:
        return None
    if table.num_rows != len(regular_lines):
        return None
    extra = []
    for i in odd.tolist():
        line = buffer[starts[i] : ends[i]]
        if line.strip():
            extra.append(_decode_json_line(name, first_line + i, line, split))
    rows = regular_lines.astype(np.int64) + first_line
    return TableBlock(name, split, rows, table, buffer, starts[regular_lines], ends[regular_lines], extra)


def _parse_run(buffer, starts, ends, lo, hi, first_line, name, split) -> Iterator[Any]:
    """Regular lines ``lo..hi`` through pyarrow; what it refuses is narrowed down to single lines."""
    import pyarrow as pa
    import pyarrow.json as pj

    if hi - lo <= _SLOW_RUN:
        for i in range(lo, hi):
            yield _decode_json_line(name, first_line + i, buffer[starts[i] : ends[i]], split)
        return
    start, end = int(starts[lo]), int(ends[hi - 1])
    source = pa.BufferReader(pa.py_buffer(memoryview(buffer)[start:end]))
    options = pj.ReadOptions(use_threads=False, block_size=max(end - start + 1, 1 << 16))
    try:
        table = pj.read_json(source, read_options=options)
    except pa.ArrowException as exc:
        match = _ROW_IN_ERROR.search(str(exc))
        bad = lo + int(match.group(1)) if match else None
        if bad is None or not lo <= bad < hi:
            mid = (lo + hi) // 2
            yield from _parse_run(buffer, starts, ends, lo, mid, first_line, name, split)
            yield from _parse_run(buffer, starts, ends, mid, hi, first_line, name, split)
            return
        yield from _parse_run(buffer, starts, ends, lo, bad, first_line, name, split)
        yield _decode_json_line(name, first_line + bad, buffer[starts[bad] : ends[bad]], split)
        yield from _parse_run(buffer, starts, ends, bad + 1, hi, first_line, name, split)
        return
    if table.num_rows != hi - lo:  # a line held two objects: only line by line can tell
        mid = (lo + hi) // 2
        yield from _parse_run(buffer, starts, ends, lo, mid, first_line, name, split)
        yield from _parse_run(buffer, starts, ends, mid, hi, first_line, name, split)
        return
    rows = np.arange(lo, hi, dtype=np.int64) + first_line
    yield TableBlock(name, split, rows, table, buffer, starts[lo:hi], ends[lo:hi])


_READERS = {
    "jsonl": _read_jsonl,
    "json": _read_json,
    "csv": _read_csv,
    "tsv": _read_tsv,
    "parquet": _read_parquet,
    "datasets": _read_datasets,
}
