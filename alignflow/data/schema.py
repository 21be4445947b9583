"""The canonical record every reader normalises to, and the snapshot's table layout.

One row per input row, whatever its shape, so that counts add up end to end:
``kind`` says which shape it is. Chat-message fields are stored as JSON text in the same
columns (``conversational`` is True), a ranked row's responses always as a JSON list;
``decode_record`` turns them back into lists.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import pyarrow as pa


class RecordKind(StrEnum):
    PAIR = "pair"  # prompt, chosen, rejected
    SCORED = "scored"  # prompt, completion, score in [0, 1]
    UNPAIRED = "unpaired"  # prompt, completion, label (KTO)
    PROMPT = "prompt"  # prompt only (online RL)
    RANKED = "ranked"  # prompt, responses (two or more), scores (one each, higher is better)


COLUMNS: dict[str, pa.DataType] = {
    "id": pa.string(),
    "kind": pa.string(),
    "prompt": pa.string(),
    "chosen": pa.string(),
    "rejected": pa.string(),
    "completion": pa.string(),
    "score": pa.float64(),
    "label": pa.bool_(),
    "margin": pa.float64(),
    "responses": pa.string(),  # JSON list: each response text or a message list
    "scores": pa.list_(pa.float64()),
    "conversational": pa.bool_(),
    "source": pa.string(),
    "metadata": pa.string(),  # JSON object
}
SNAPSHOT_SCHEMA = pa.schema([pa.field(name, dtype) for name, dtype in COLUMNS.items()])
MESSAGE_FIELDS = ("prompt", "chosen", "rejected", "completion")


def encode_record(record: dict[str, Any]) -> dict[str, Any]:
    """Canonical dict (text or message lists) -> a row of the snapshot table."""
    row = {name: record.get(name) for name in COLUMNS}
    conversational = any(isinstance(record.get(f), list) for f in MESSAGE_FIELDS)
    row["conversational"] = conversational
    if conversational:
        for field in MESSAGE_FIELDS:
            if record.get(field) is not None:
                row[field] = json.dumps(record[field], ensure_ascii=False)
    if record.get("responses") is not None:
        row["responses"] = json.dumps(record["responses"], ensure_ascii=False)
    row["metadata"] = json.dumps(record.get("metadata") or {}, ensure_ascii=False, sort_keys=True)
    row["kind"] = str(record.get("kind") or RecordKind.PAIR)
    return row


def decode_record(row: dict[str, Any]) -> dict[str, Any]:
    """A snapshot row -> the canonical dict, with message lists and metadata decoded."""
    record = {k: v for k, v in row.items() if v is not None and k != "conversational"}
    if row.get("conversational"):
        for field in MESSAGE_FIELDS:
            if isinstance(record.get(field), str):
                record[field] = json.loads(record[field])
    if isinstance(record.get("responses"), str):
        record["responses"] = json.loads(record["responses"])
    record["metadata"] = json.loads(row.get("metadata") or "{}")
    return record
