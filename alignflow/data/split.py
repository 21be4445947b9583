"""Deterministic train/eval split by prompt hash: one prompt never lands on both sides.

The hash covers only the prompt (and a seed), so every pair, score and prompt-only row of
one prompt goes the same way, the split does not depend on row order, and adding data never
moves an old prompt across the boundary, with one exception: when the hash holds out no
prompt at all (a handful of prompts), the one closest to the boundary is held out, so that a
trained model can always be measured on something it did not see. Once the data holds a
prompt the hash holds out, that stand-in goes back to train.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from alignflow.data.checks import as_text


def prompt_key(prompt: Any) -> str:
    """The text a prompt is compared by: plain text as is, messages as sorted-key JSON."""
    return as_text(prompt) or ""


def distinct_prompt_rows(
    records: Iterable[Mapping[str, Any]], limit: int | None = None
) -> list[dict[str, Any]]:
    """Each distinct prompt once, in order of first appearance, with its first record's metadata
    (answers, slices); at most ``limit``. What a policy is asked on a split."""
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    for record in records:
        prompt = record.get("prompt")
        if prompt is None or prompt_key(prompt) in seen:
            continue
        seen.add(prompt_key(prompt))
        rows.append({"prompt": prompt, "metadata": record.get("metadata") or {}})
        if len(rows) == limit:
            break
    return rows


def prompt_fraction(prompt: Any, seed: int = 0) -> float:
    """A stable number in [0, 1) for a prompt."""
    digest = hashlib.sha256(f"{seed}\x1f{prompt_key(prompt)}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(prompt: Any, eval_fraction: float, seed: int = 0) -> str:
    return "eval" if prompt_fraction(prompt, seed) < eval_fraction else "train"


def split_records(
    records: list[dict[str, Any]],
    eval_fraction: float,
    seed: int = 0,
    user_splits: list[str | None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Records by split; a user-supplied split (``train``/``eval``) wins over the hash."""
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for i, record in enumerate(records):
        given = user_splits[i] if user_splits else None
        splits[given or assign_split(record["prompt"], eval_fraction, seed)].append(record)
    if eval_fraction > 0 and not splits["eval"] and not any(user_splits or ()):
        splits = _hold_out_one_prompt(splits["train"], seed)
    return splits


def _hold_out_one_prompt(records: list[dict[str, Any]], seed: int) -> dict[str, list[dict[str, Any]]]:
    """Every row of the prompt nearest the boundary goes to eval, when there are two prompts or more."""
    keys = {prompt_key(r["prompt"]): prompt_fraction(r["prompt"], seed) for r in records}
    if len(keys) < 2:
        return {"train": records, "eval": []}
    held_out = min(keys, key=lambda k: (keys[k], k))
    return {
        "train": [r for r in records if prompt_key(r["prompt"]) != held_out],
        "eval": [r for r in records if prompt_key(r["prompt"]) == held_out],
    }


def leaked_prompts(train: list[dict[str, Any]], evaluation: list[dict[str, Any]]) -> set[str]:
    """Prompt keys present on both sides (only possible with user-supplied splits)."""
    return {prompt_key(r["prompt"]) for r in train} & {prompt_key(r["prompt"]) for r in evaluation}
