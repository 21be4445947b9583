"""How many tokens a model can read: the size of a learned table of absolute positions.

BERT/MiniLM, GPT-2 and OPT look each position up in a table; an input longer than the table
indexes past it and crashes (``IndexError: index out of range in self``) on the first long
row, far from the cause. Rotary and relative models (Llama, Qwen, T5) have no such table and
read longer inputs, if less well, so they get no limit here.
"""

from __future__ import annotations

from typing import Any

import torch

from alignflow.errors import InputError

# modules holding a learned table of absolute positions (BERT/MiniLM, GPT-2, OPT/BART)
POSITION_TABLES = ("position_embeddings", "wpe", "embed_positions")


def position_limit(model: Any, tokenizer: Any) -> int | None:
    """The most tokens a model with absolute positions reads; None for rotary/relative ones.

    Where the table holds more rows than usable positions (RoBERTa, OPT keep an offset), the
    tokenizer's ``model_max_length`` states the smaller limit.
    """
    tables = [
        module.num_embeddings
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_TABLES
    ]
    if not tables:
        return None
    stated = getattr(tokenizer, "model_max_length", None)
    usable = stated if isinstance(stated, int) and 0 < stated < 1_000_000 else None
    return min([*tables, usable] if usable else tables)


def prompt_token_budget(
    tokenizer: Any, max_new_tokens: int, *models: Any, key: str = "max_new_tokens"
) -> int | None:
    """The most prompt tokens that leave room for ``max_new_tokens`` in every one of ``models``'
    positions; None when none has a position table. InputError (naming the setting ``key``)
    when nothing is left for a prompt."""
    limits = [n for n in (position_limit(m, tokenizer) for m in models) if n is not None]
    if not limits:
        return None
    limit = min(limits)
    if max_new_tokens >= limit:
        raise InputError(f"{key} {max_new_tokens} leaves no room for a prompt in {limit} positions")
    return limit - max_new_tokens
