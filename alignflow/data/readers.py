"""Read preference data from JSONL, JSON, Parquet, CSV, gzip of these and ``datasets`` dirs.

Readers never raise on bad content: each input row comes back as a :class:`RawRow`, and a
line or file that cannot be decoded comes back as a row carrying an :class:`Issue`. That
is what lets validation promise that every input row is accounted for.

Text is decoded with ``surrogateescape`` so that invalid UTF-8 survives as lone surrogates;
the checks then name the row instead of the whole file failing to decode.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.data.issues import Issue, Reason

FORMATS = ("jsonl", "json", "parquet", "csv", "datasets")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
}
_GZIP_MAGIC = b"\x1f\x8b"
_SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "eval": "eval",
    "test": "eval",
    "validation": "eval",
    "valid": "eval",
    "dev": "eval",
}


class FormatError(ValueError):
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
    stripped = head.lstrip()
    if stripped.startswith(b"["):
        return "json"
    if stripped.startswith(b"{"):
        return "jsonl"
    raise FormatError(f"{path}: cannot detect the format; pass --format one of {', '.join(FORMATS)}")


def _open_binary(path: Path):
    return gzip.open(path, "rb") if is_gzip(path) else path.open("rb")


def split_hint(path: Path) -> str | None:
    """A user-supplied split from a file name such as ``train.jsonl`` or ``test-00000.parquet``."""
    stem = path.name.split(".")[0].lower()
    for part in stem.replace("_", "-").split("-"):
        if part in _SPLIT_ALIASES:
            return _SPLIT_ALIASES[part]
    return None


def iter_input_files(path: Path) -> list[Path]:
    """A file, or every data file of a plain directory in sorted (deterministic) order."""
    if path.is_dir() and not is_datasets_dir(path):
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [path]


def read_rows(path: str | Path, fmt: str | None = None, hint_splits: bool = False) -> Iterator[RawRow]:
    """Every row of ``path`` (a file or directory); read errors come back as rows with an issue."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise FormatError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not path.exists():
        yield RawRow(
            str(path), None, None, issue=Issue(Reason.FILE_NOT_FOUND, "no such file or directory", str(path))
        )
        return
    for file in iter_input_files(path):
        file_fmt = fmt or detect_format(file)
        split = split_hint(file) if hint_splits else None
        yield from _read_file(file, file_fmt, split)


def _read_file(file: Path, fmt: str, split: str | None) -> Iterator[RawRow]:
    name = str(file)
    count = 0
    try:
        for row in _READERS[fmt](file, split):
            count += 1
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
    text = raw.decode("utf-8", errors="surrogateescape")
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
            if raw.strip():
                yield _decode_json_line(name, number, raw, split)


def _read_json(file: Path, split: str | None) -> Iterator[RawRow]:
    name = str(file)
    with _open_binary(file) as fh:
        text = fh.read().decode("utf-8", errors="surrogateescape")
    data = json.loads(text)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise ValueError("a JSON object must hold exactly one list of records (e.g. {'data': [...]})")
        data = lists[0]
    if not isinstance(data, list):
        raise ValueError("expected a list of records")
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


def _read_csv(file: Path, split: str | None) -> Iterator[RawRow]:
    name = str(file)
    with _open_binary(file) as fh:
        text = fh.read().decode("utf-8", errors="surrogateescape")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for number, row in enumerate(reader, start=1):
        if None in row:  # more cells than header columns
            yield RawRow(
                name,
                number,
                None,
                split,
                Issue(
                    Reason.UNKNOWN_SHAPE,
                    "row has more cells than the header",
                    name,
                    number,
                    original=row[None],
                ),
            )
            continue
        # an empty CSV cell is an absent value, not an empty string
        yield RawRow(name, number, {k: (v if v != "" else None) for k, v in row.items()}, split)


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


_READERS = {
    "jsonl": _read_jsonl,
    "json": _read_json,
    "csv": _read_csv,
    "parquet": _read_parquet,
    "datasets": _read_datasets,
}
