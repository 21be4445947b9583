"""Human feedback as handed to the Python API, checked and turned into the pipeline's snapshot.

A caller passes dicts or objects (ORM rows, dataclasses) of two kinds: ratings
``{prompt, response, score}`` with the score in [0, 1], and comparisons
``{prompt, chosen, rejected}``. They are checked here, row by row, so that a bad one is
reported with its index instead of failing deep inside a training stage, and written as
the service's export lines so the one snapshot writer (:mod:`alignflow.data.feedback`)
splits them: by prompt, every row kept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

FEEDBACK_EXPORT = "feedback.jsonl"
DATA_DIR = "data"
_OPTIONAL = {"runId": "run_id", "run_id": "run_id", "notes": "notes", "agent_id": "agent_id"}


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def _prompt(value: Any, where: str) -> Any:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(m, Mapping) and "content" in m for m in value):
        return [dict(m) for m in value]
    raise ValueError(
        f"{where}: 'prompt' must be a non-empty string or a list of chat messages, got {value!r}"
    )


def _text(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {name!r} must be a string, got {type(value).__name__}")
    return value


def _score(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: 'score' must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: 'score' must be in [0, 1], got {value}")
    return float(value)


def feedback_record(item: Any, index: int) -> dict[str, Any]:
    """One rating or comparison as an export line (``id`` kept when given, else ``fb-<index>``)."""
    where = f"feedback[{index}]"
    record: dict[str, Any] = {
        "id": str(_field(item, "id") or f"fb-{index}"),
        "prompt": _prompt(_field(item, "prompt"), where),
    }
    if _field(item, "chosen") is not None or _field(item, "rejected") is not None:
        record["chosen"] = _text(_field(item, "chosen"), "chosen", where)
        record["rejected"] = _text(_field(item, "rejected"), "rejected", where)
    elif _field(item, "score") is not None:
        record["response"] = _text(_field(item, "response"), "response", where)
        record["score"] = _score(_field(item, "score"), where)
    else:
        raise ValueError(
            f"{where}: neither a rating (prompt, response, score) nor a comparison (prompt, chosen, rejected)"
        )
    extras = dict(_field(item, "metadata") or {})
    extras.update(
        {key: _field(item, name) for name, key in _OPTIONAL.items() if _field(item, name) is not None}
    )
    if extras:
        record["metadata"] = extras
    return record


def feedback_records(feedbacks: Iterable[Any]) -> list[dict[str, Any]]:
    """Every feedback item checked and as an export line; ids must be unique."""
    records = [feedback_record(item, i) for i, item in enumerate(feedbacks)]
    seen: set[str] = set()
    for i, record in enumerate(records):
        if record["id"] in seen:
            raise ValueError(f"feedback[{i}]: duplicate id {record['id']!r}")
        seen.add(record["id"])
    return records


def is_rating(record: Mapping[str, Any]) -> bool:
    return "score" in record


def write_snapshot(
    records: list[dict[str, Any]], output_dir: str | Path, eval_fraction: float
) -> tuple[Path, str]:
    """``feedback.jsonl`` + the snapshot ``data/`` under ``output_dir``; returns (data dir, version)."""
    from alignflow.data.feedback import write_feedback_snapshot

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    export = output_dir / FEEDBACK_EXPORT
    export.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records), encoding="utf-8")
    data_dir = output_dir / DATA_DIR
    version = write_feedback_snapshot(export, data_dir, eval_fraction=eval_fraction)
    return data_dir, version
