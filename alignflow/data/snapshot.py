"""Reading and writing a dataset snapshot: ``train``/``eval``/``quarantine`` Parquet + manifest.

A snapshot directory is what DVC versions and what every stage reads. Stages load
splits through :func:`load_split` and never parse Parquet themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from alignflow.data.schema import SNAPSHOT_SCHEMA, decode_record, encode_record

SPLITS = ("train", "eval")
QUARANTINE = "quarantine"
MANIFEST = "manifest.json"


def split_path(data_dir: str | Path, split: str) -> Path:
    return Path(data_dir) / f"{split}.parquet"


def write_split(data_dir: str | Path, split: str, records: list[dict[str, Any]]) -> Path:
    """Write canonical records as one split's Parquet file (atomically: tmp then rename)."""
    path = split_path(data_dir, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([encode_record(r) for r in records], schema=SNAPSHOT_SCHEMA)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def load_split(data_dir: str | Path, split: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Canonical records of one split, optionally only those of one ``kind``."""
    path = split_path(data_dir, split)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no {split!r} split in snapshot {data_dir}")
    rows = pq.read_table(path).to_pylist()
    records = [decode_record(row) for row in rows]
    return [r for r in records if kind is None or r["kind"] == kind]


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(data_dir) / MANIFEST).read_text(encoding="utf-8"))


def write_manifest(data_dir: str | Path, manifest: dict[str, Any]) -> Path:
    path = Path(data_dir) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("code", pa.string()),
        pa.field("field", pa.string()),
        pa.field("message", pa.string()),
        pa.field("original", pa.string()),  # the input row as JSON
    ]
)


def write_quarantine(data_dir: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write quarantined rows (file, row, reason code, field, message, original JSON)."""
    path = split_path(data_dir, QUARANTINE)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(
        [{k: r.get(k) for k in QUARANTINE_SCHEMA.names} for r in rows], schema=QUARANTINE_SCHEMA
    )
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path
