"""A decoder's forward over a padded batch without computing the padding.

Preference rows differ wildly in length, so a batch padded to its longest row spends much of
a training step on padding (HH-RLHF pairs in SmolLM2's bench: 55-63% of the slots were real
tokens). transformers skips padding only with FlashAttention's variable-length kernels, which
a CPU lacks. :func:`packed_forward` instead lays the rows' real tokens end to end into fewer
rows no wider than the batch (first fit, longest first), runs the decoder body once over
them with a block-diagonal causal mask, and puts every token's hidden state back where the
padded forward would have left it. Each token keeps the position and the context it had in
its own row, so the result is that of the padded forward (rounding aside); padding slots
come back as zeros, which nothing downstream reads.

The mask is built here from the rows, not left to transformers' packed-sequence detection:
that splits sequences where ``position_ids`` restart, and a left-padded row numbered by column
continues its neighbour's count. Only the attention implementations whose mask is a plain
tensor (``sdpa``, ``eager``) take a packed mask; other calls (a cache, embeddings instead
of ids, a batch that would not shrink) are left to the caller's plain forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from alignflow.models.fixed_cache_decoding import DECODER_TYPES, attends_whole_context

# a mask given to the attention as a 4D tensor: bool for SDPA, additive for eager
PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})
PLAIN_ARGUMENTS = frozenset({"input_ids", "attention_mask", "position_ids", "use_cache", "return_dict"})


@dataclass(frozen=True)
class PackPlan:
    """Where each real token of a ``[rows, width]`` batch goes in ``[packed_rows, packed_width]``."""

    packed_rows: int
    packed_width: int
    source: torch.Tensor  # flat index of each real token in the padded batch
    target: torch.Tensor  # flat index of the same token in the packed batch
    segments: torch.Tensor  # [packed_rows, packed_width]: the padded row of each slot, -1 - slot for filler


def first_fit_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Row indices grouped into bins of at most ``capacity`` tokens, longest rows placed first,
    each into the first bin with room; a row longer than ``capacity`` gets a bin of its own."""
    bins: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        size = lengths[row]
        spot = next((i for i, free in enumerate(room) if free >= size), None)
        if spot is None:
            bins.append([row])
            room.append(capacity - size)
        else:
            bins[spot].append(row)
            room[spot] -= size
    return bins


def pack_plan(attention_mask: torch.Tensor) -> PackPlan | None:
    """The packing of a batch whose padding is marked by ``attention_mask`` (``[rows, width]``,
    1 for real tokens), or None where packing would not save a row."""
    if attention_mask.dim() != 2 or attention_mask.shape[0] < 2:
        return None
    rows, width = attention_mask.shape
    real = attention_mask.bool()
    lengths = real.sum(-1).tolist()
    bins = first_fit_bins(lengths, width)
    if len(bins) >= rows:
        return None
    packed_width = max(sum(lengths[r] for r in members) for members in bins)
    device = attention_mask.device
    columns = torch.arange(width, device=device)
    source, target = [], []
    segments = -1 - torch.arange(len(bins) * packed_width, device=device).view(len(bins), packed_width)
    for slot_row, members in enumerate(bins):
        start = 0
        for row in members:
            taken = columns[real[row]]
            source.append(row * width + taken)
            target.append(slot_row * packed_width + start + torch.arange(len(taken), device=device))
            segments[slot_row, start : start + len(taken)] = row
            start += len(taken)
    return PackPlan(len(bins), packed_width, torch.cat(source), torch.cat(target), segments)


def packed_attention_mask(plan: PackPlan, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """``[packed_rows, 1, w, w]``: a slot sees the earlier slots of its own row's tokens (and a
    filler slot only itself), as a bool mask for SDPA or an additive one for eager attention."""
    seg = plan.segments
    same = seg[:, :, None] == seg[:, None, :]
    width = plan.packed_width
    causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
    allowed = (same & causal)[:, None]
    if implementation == "sdpa":
        return allowed
    additive = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)


def packed_forward(
    body: Any, plan: PackPlan, input_ids: torch.Tensor, position_ids: torch.Tensor | None, **kwargs: Any
) -> torch.Tensor:
    """The body's last hidden states for the padded ``input_ids`` (``[rows, width, d]``, zeros
    at padding), computed over the packed rows of ``plan``. Positions are ``position_ids``
    where given, else each token's column, as the padded forward numbers them."""
    rows, width = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(width, device=input_ids.device)
    shape = (plan.packed_rows, plan.packed_width)

    def packed(values: torch.Tensor) -> torch.Tensor:
        out = values.new_zeros(shape[0] * shape[1])
        return out.index_copy(0, plan.target, values.reshape(-1).index_select(0, plan.source)).view(shape)

    mask = packed_attention_mask(plan, body.config._attn_implementation, body.dtype)
    ids, positions = packed(input_ids), packed(position_ids.expand(rows, width))
    hidden = body(input_ids=ids, position_ids=positions, attention_mask=mask, **kwargs).last_hidden_state
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = flat.new_zeros(rows * width, flat.shape[-1])
    return out.index_copy(0, plan.source, flat.index_select(0, plan.target)).view(rows, width, -1)


def can_pack(body: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``body(**kwargs)`` is a plain padded forward of a decoder this module packs
    exactly: a type whose every layer is causal over the whole row, a tensor mask."""
    config = getattr(body, "config", None)
    if getattr(config, "model_type", None) not in DECODER_TYPES:
        return False
    if getattr(config, "_attn_implementation", None) not in PACKABLE_ATTENTION:
        return False
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if not isinstance(ids, torch.Tensor) or not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        return False
    if ids.dim() != 2 or not attends_whole_context(config, ids.shape[1]):
        return False
    return set(kwargs) <= PLAIN_ARGUMENTS and not kwargs.get("use_cache")


def last_hidden_state(body: Any, **kwargs: Any) -> torch.Tensor:
    """``body(**kwargs).last_hidden_state``, over packed rows where that is exact and saves
    rows (padding slots then hold zeros)."""
    plan = pack_plan(kwargs["attention_mask"]) if can_pack(body, kwargs) else None
    if plan is None:
        return body(**kwargs).last_hidden_state
    rest = {k: v for k, v in kwargs.items() if k not in {"input_ids", "attention_mask", "position_ids"}}
    return packed_forward(body, plan, kwargs["input_ids"], kwargs.get("position_ids"), **rest)
