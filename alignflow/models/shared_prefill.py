"""Sampling several completions per prompt without reading each prompt several times.

GRPO samples a group of completions for every prompt, and TRL hands ``generate`` a batch
in which each prompt is repeated once per completion: the prefill then computes every
prompt's keys and values as many times as the group is large (8 on the SmolLM2 math
config, where it was ~10% of the stage on a CPU). :func:`generate_sharing_prefills`
prefills each distinct row of the batch once, copies its cache to the rows that repeat
it, and lets ``generate`` decode from there: the same tokens, the same sampling stream
(the prefill draws no random numbers), one prefill per prompt.

A batch of distinct prompts often opens alike: a chat template's system turn starts every
SmolLM2 prompt with the same 24 tokens, a sixth of an HH-RLHF evaluation prompt.
:func:`generate_sharing_prefix` prefills that common opening once and copies its cache to
every row; each row is laid out as [opening][padding][rest], so the positions (counted from
the attention mask) and the tokens each row reads are those of the left-padded row. In fp32
the answers are the same (48 of 48 HH prompts on SmolLM2); in bf16 the opening's keys and
values round as a one-row product and greedy answers drift where two tokens nearly tie (58
of 96 the same, where batches of 12 instead of 16 kept 39 of 48). Evaluation generation:
~6% less time on SmolLM2 with its 24-token system turn, more under a longer system prompt.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import GenerationConfig

GENERATION_DEFAULTS = GenerationConfig()
DECODING_HOOKS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "streamer")


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first row of each distinct (ids, mask) row, and for every row the index of its
    distinct row among those."""
    keyed = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    _, inverse = torch.unique(keyed, dim=0, return_inverse=True)
    rows = torch.arange(len(keyed), device=keyed.device)
    first = torch.full((int(inverse.max()) + 1,), len(keyed), device=keyed.device)
    return first.scatter_reduce(0, inverse, rows, reduce="amin"), inverse


def can_share(generation_config: Any, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> bool:
    """Whether a call is one this path handles: ids (at least two tokens a row) and settings
    of generation only (no embeddings, images or cache of the caller's), one sampled or
    greedy sequence per row, a cache that transformers grows as it goes."""
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        return False
    if any(not hasattr(GENERATION_DEFAULTS, k) and k not in DECODING_HOOKS for k in kwargs):
        return False

    def setting(name: str) -> Any:
        return kwargs.get(name, getattr(generation_config, name, getattr(GENERATION_DEFAULTS, name)))

    plain_cache = setting("cache_implementation") in (None, "dynamic")
    return (setting("num_beams") or 1) == 1 and (setting("num_return_sequences") or 1) == 1 and plain_cache


def prefill(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
    """The cache of every token but the last of each (left-padded) row, positions counted as
    ``generate`` counts them (from the first real token); only the last logit is computed."""
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    with torch.no_grad():
        out = model(
            input_ids=input_ids[:, :-1],
            attention_mask=attention_mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            logits_to_keep=1,
        )
    return out.past_key_values


def generate_sharing_prefills(
    generate: Callable[..., Any],
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    generation_config: Any = None,
    **kwargs: Any,
) -> Any:
    """``generate(input_ids, ...)`` with each distinct row prefilled once. The plain call
    where no row repeats or where :func:`can_share` says no."""
    plain = functools.partial(generate, input_ids=input_ids, generation_config=generation_config, **kwargs)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    if not can_share(generation_config or model.generation_config, input_ids, kwargs):
        return plain(attention_mask=attention_mask)
    kept, rows = distinct_rows(input_ids, mask)
    if len(kept) == len(input_ids):
        return plain(attention_mask=attention_mask)
    cache = prefill(model, input_ids[kept], mask[kept])
    cache.reorder_cache(rows)
    return plain(attention_mask=mask, past_key_values=cache)


@contextlib.contextmanager
def generate_wrapped(model: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[Any]:
    """While inside, ``model.generate`` is ``wrap(the generate in place on entry)``; on exit the
    instance holds what it held before (its own attribute, or none)."""
    shadowed = vars(model).get("generate")
    model.generate = wrap(model.generate)
    try:
        yield model
    finally:
        if shadowed is None:
            del model.generate
        else:
            model.generate = shadowed


def sharing_prefills(model: Any) -> contextlib.AbstractContextManager[Any]:
    """While inside, ``model.generate(input_ids=...)`` prefills each distinct row once."""

    def wrap(plain: Callable[..., Any]) -> Callable[..., Any]:
        def generate(input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
            if input_ids is None:
                return plain(**kwargs)
            return generate_sharing_prefills(plain, model, input_ids, **kwargs)

        return generate

    return generate_wrapped(model, wrap)


MIN_SHARED_OPENING = 8  # fewer common leading tokens are not worth a separate prefill


def common_opening(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading tokens every row of a left-padded batch shares after its padding,
    leaving each row at least one token of its own (0 where the padding is not all on the left)."""
    width = input_ids.shape[1]
    lengths = attention_mask.long().sum(1)
    starts = width - lengths
    if not torch.equal(
        attention_mask.bool(), torch.arange(width, device=input_ids.device) >= starts[:, None]
    ):
        return 0
    span = int(lengths.min()) - 1
    if span <= 0:
        return 0
    heads = input_ids.gather(1, starts[:, None] + torch.arange(span, device=input_ids.device))
    differs = (heads != heads[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else span


def opening_first(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, opening: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each left-padded row as [its first ``opening`` real tokens][its padding][the rest]."""
    width = input_ids.shape[1]
    starts = (width - attention_mask.long().sum(1))[:, None]
    columns = torch.arange(width, device=input_ids.device).expand(len(input_ids), width)
    order = torch.where(
        columns < opening,
        columns + starts,
        torch.where(columns < opening + starts, columns - opening, columns),
    )
    return input_ids.gather(1, order), attention_mask.gather(1, order)


def opening_cache(model: Any, opening_ids: torch.Tensor, rows: int) -> Any:
    """The cache of ``opening_ids`` (one row, positions from 0) copied to ``rows`` rows."""
    with torch.no_grad():
        cache = model(input_ids=opening_ids[None], use_cache=True).past_key_values
    cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=opening_ids.device))
    return cache


def generate_sharing_prefix(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any
) -> Any:
    """``model.generate`` on a left-padded batch, the rows' common opening prefilled once.
    Returns what ``generate`` returns: each row's prompt columns (reordered as
    :func:`opening_first` lays them out) and then its new tokens. The plain call where the
    opening is shorter than :data:`MIN_SHARED_OPENING` or :func:`can_share` says no."""
    opening = common_opening(input_ids, attention_mask) if len(input_ids) > 1 else 0
    if (
        opening < MIN_SHARED_OPENING
        or getattr(model.config, "is_encoder_decoder", False)
        or not can_share(getattr(model, "generation_config", None), input_ids, kwargs)
    ):
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    ids, mask = opening_first(input_ids, attention_mask, opening)
    cache = opening_cache(model, ids[0, :opening], len(ids))
    return model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, **kwargs)
