"""Feedback rows (scored or pairwise, as the service exports them) as a training snapshot.

The service validated every field when it accepted the feedback, so every row is kept;
the split is by prompt hash, so a prompt never sits on both sides, and the eval split is
never empty while there are two prompts or more (held-out prompts are what a trained
policy's reward is measured on).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _split_of(prompt: Any, eval_fraction: float) -> str:
    """Deterministic by prompt, so a prompt never sits in both splits."""
    key = json.dumps(prompt, sort_keys=True).encode("utf-8")
    bucket = int(hashlib.sha256(key).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "eval" if bucket < eval_fraction else "train"


def canonical_from_export(record: dict[str, Any]) -> dict[str, Any]:
    """An export line (scored or pairwise feedback) as a snapshot record."""
    common = {
        "id": record["id"],
        "prompt": record["prompt"],
        "source": record.get("source"),
        "metadata": record.get("metadata") or {},
    }
    if "chosen" in record:
        return {**common, "kind": "pair", "chosen": record["chosen"], "rejected": record["rejected"]}
    return {**common, "kind": "scored", "completion": record["response"], "score": float(record["score"])}


def write_feedback_snapshot(export_path: Path, data_dir: Path, eval_fraction: float = 0.1) -> str:
    """Turn a feedback export into a snapshot directory; returns its data version (content hash).

    Feedback was validated field by field when the API accepted it, so every row is kept.
    """
    from alignflow.data.snapshot import write_manifest, write_split

    raw = export_path.read_bytes()
    records = [canonical_from_export(json.loads(line)) for line in raw.decode("utf-8").splitlines() if line]
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for record in records:
        splits[_split_of(record["prompt"], eval_fraction)].append(record)
    prompts = {json.dumps(r["prompt"], sort_keys=True) for r in splits["train"]}
    if not splits["eval"] and len(prompts) > 1:
        held_out = max(prompts)  # deterministic: the same feedback always holds out the same prompt
        splits["eval"] = [r for r in splits["train"] if json.dumps(r["prompt"], sort_keys=True) == held_out]
        splits["train"] = [r for r in splits["train"] if json.dumps(r["prompt"], sort_keys=True) != held_out]
    for name, rows in splits.items():
        write_split(data_dir, name, rows)
    write_split(data_dir, "quarantine", [])
    version = hashlib.md5(raw).hexdigest()
    write_manifest(
        data_dir,
        {
            "source": str(export_path),
            "data_version": version,
            "counts": {
                "input": len(records),
                "train": len(splits["train"]),
                "eval": len(splits["eval"]),
                "quarantine": 0,
            },
        },
    )
    return version
