"""Preference pairs of a snapshot split: the ``pair`` rows plus pairs formed from ratings
and rankings.

Two ratings of one prompt with different scores make a pair (the higher score is chosen), as
do two responses of one ranked row; this is what every pairwise consumer (reward model, DPO,
evaluation) trains or measures on.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from alignflow.data.snapshot import load_split
from alignflow.data.split import prompt_key
from alignflow.errors import InputError


def pairs_from_scored(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Preference pairs formed per prompt from scored rows: the higher score is chosen.

    Equal scores carry no preference and form no pair, nor does one text rated twice (as a
    pair with chosen equal to rejected would be quarantined); ``margin`` is the score gap.
    """
    by_prompt: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_prompt.setdefault(prompt_key(record["prompt"]), []).append(record)
    pairs = []
    for rows in by_prompt.values():
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if a["score"] == b["score"] or a["completion"] == b["completion"]:
                    continue
                hi, lo = (a, b) if a["score"] > b["score"] else (b, a)
                pairs.append(
                    {
                        "id": f"{hi.get('id')}>{lo.get('id')}",
                        "prompt": hi["prompt"],
                        "chosen": hi["completion"],
                        "rejected": lo["completion"],
                        "margin": float(hi["score"] - lo["score"]),
                        "metadata": hi.get("metadata") or {},
                    }
                )
    return pairs


def pairs_from_ranked(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every pair of one ranked row's responses with different scores, the higher one chosen
    (a RewardBench 2 row of one chosen and three rejected makes three pairs). No margin: a
    ranking's scores are on no declared scale. A text listed twice pairs with neither copy."""
    pairs = []
    for record in records:
        responses, scores = record["responses"], record["scores"]
        for i, j in itertools.combinations(range(len(responses)), 2):
            if scores[i] == scores[j] or responses[i] == responses[j]:
                continue
            hi, lo = (i, j) if scores[i] > scores[j] else (j, i)
            pairs.append(
                {
                    "id": f"{record.get('id')}:{hi}>{lo}",
                    "prompt": record["prompt"],
                    "chosen": responses[hi],
                    "rejected": responses[lo],
                    "source": record.get("source"),
                    "metadata": record.get("metadata") or {},
                }
            )
    return pairs


def best_responses(record: Mapping[str, Any]) -> list[Any]:
    """The responses of a ranked row that share its top score."""
    top = max(record["scores"])
    return [r for r, s in zip(record["responses"], record["scores"], strict=True) if s == top]


def load_pairs(data_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """A split's preference pairs: ``pair`` rows plus pairs formed from ``scored`` and ``ranked`` rows."""
    return (
        load_split(data_dir, split, kind="pair")
        + pairs_from_scored(load_split(data_dir, split, kind="scored"))
        + pairs_from_ranked(load_split(data_dir, split, kind="ranked"))
    )


def load_optional_pairs(data_dir: str | Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Like :func:`load_pairs` but an absent split is empty (eval is optional)."""
    try:
        pairs = load_pairs(data_dir, split)
    except FileNotFoundError:
        return []
    return pairs[:limit] if limit else pairs


def require_rows(rows: list, data_dir: str | Path, split: str, what: str) -> list:
    """``rows``, unless empty: then an error saying what the split holds instead."""
    if not rows:
        raise InputError(
            f"{data_dir}/{split}.parquet: no {what} rows for this stage ({_held(data_dir, split)})"
        )
    return rows


def _held(data_dir: str | Path, split: str) -> str:
    try:
        kinds = Counter(str(record["kind"]) for record in load_split(data_dir, split))
    except FileNotFoundError:
        return "the split is missing"
    if not kinds:
        return "the split is empty"
    return "it holds " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))


def corpus_texts(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every text field of the records: what the tiny preset trains its tokenizer on."""
    texts = []
    for record in records:
        values = [record.get(key) for key in ("prompt", "chosen", "rejected", "completion")]
        for value in [*values, *(record.get("responses") or ())]:
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, list):
                texts.extend(m.get("content", "") for m in value)
    return texts
