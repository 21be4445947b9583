"""Sampling with every row's keys and values in buffers laid out once, for decoder-only
models of the Llama family.

transformers' ``generate`` grows each layer's cache by concatenation at every token (a copy
of the whole cache, per layer and per step) and walks the model's generic forward (mask
building, cache bookkeeping, casts) for a batch of single tokens. On SmolLM2-135M sampling 16
rows x 40 tokens on 2 CPU cores, that bookkeeping cost more than the matrix products of the
decode. :func:`sample_with_fixed_cache` prefills each distinct prompt once with the model's
own forward, copies its cache into buffers sized for the whole answer, then runs each decode
step through the model's own modules (norms, projections, rotary embedding, MLP, head) with
attention over the filled part of the buffers by the kernel faster on this CPU
(:mod:`~alignflow.models.decode_attention`: torch's fused SDPA on an AMX Xeon, plain matmuls
on an AMD EPYC). Token choice goes through the logits
processors transformers builds for the same generation config, so the settings mean what they
mean to ``generate``; the output has ``generate``'s layout (the prompt, then the new tokens,
rows that ended padded).

Only calls it can honour take this path (:func:`fixed_cache_plan`): a transformers model of a
type listed in :data:`DECODER_TYPES` attending to its whole context, ids and an attention mask,
generation settings only (no streamer, hooks, scores or cache of the caller's), one sampled or
greedy sequence per row. Every other call is the plain ``generate``.
:func:`~alignflow.models.decoding.cpu_decoding` turns it on while a model generates on a CPU.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode

from alignflow.models.decode_attention import decode_attention
from alignflow.models.shared_prefill import distinct_rows, generate_wrapped

# decoder layers of pre-norm attention (rotary positions, grouped keys) and a gated MLP,
# with the same module names
DECODER_TYPES = frozenset({"llama", "mistral", "qwen2"})
INPUTS = frozenset({"input_ids", "attention_mask", "generation_config"})
ONE_SEQUENCE_MODES = frozenset({GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH})


@dataclass(frozen=True)
class FixedCachePlan:
    """What a call asks of the decode, resolved as ``generate`` resolves it."""

    max_new_tokens: int
    do_sample: bool
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    processors: Any  # transformers' LogitsProcessorList


def attends_whole_context(config: Any, length: int) -> bool:
    """Whether every layer reads all earlier tokens of a ``length``-token row (no sliding
    window shorter than it)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or ()
    slides = any(kind != "full_attention" for kind in layer_types) or (
        window is not None and getattr(config, "use_sliding_window", True) and not layer_types
    )
    return not slides or window is None or window >= length


def is_transformers_model(model: Any) -> bool:
    """A transformers model itself (a PEFT wrapper's ``generate`` does more than its base's)."""
    return isinstance(model, PreTrainedModel)


def fixed_cache_plan(model: Any, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> FixedCachePlan | None:
    """The plan for ``model.generate(**kwargs)`` on this path, or None where the call needs
    something only ``generate`` does."""
    config = getattr(model, "config", None)
    if not is_transformers_model(model) or getattr(config, "model_type", None) not in DECODER_TYPES:
        return None
    if input_ids.dim() != 2 or input_ids.shape[1] < 1 or not hasattr(model, "model"):
        return None
    settings = {k: v for k, v in kwargs.items() if k not in INPUTS}
    # transformers' own resolution (call > model's config > defaults); what is not a
    # generation setting (a cache, a streamer, a hook) comes back as a model argument
    generation, model_kwargs = model._prepare_generation_config(kwargs.get("generation_config"), **settings)
    if model_kwargs or generation.get_generation_mode() not in ONE_SEQUENCE_MODES:
        return None
    if (generation.num_return_sequences or 1) != 1 or generation.return_dict_in_generate:
        return None
    if generation.stop_strings or generation.max_time:
        return None
    prompt = input_ids.shape[1]
    new = generation.max_new_tokens
    if new is None:
        new = generation.max_length - prompt
    if new is None or new < 1 or not attends_whole_context(config, prompt + new):
        return None
    # the special tokens as generate settles them (a missing pad becomes the first eos); the
    # processors read them from there
    model._prepare_special_tokens(generation, True, device=input_ids.device, batch_size=len(input_ids))
    eos, pad = generation._eos_token_tensor, generation._pad_token_tensor
    eos_ids = () if eos is None else tuple(int(t) for t in eos.flatten().tolist())
    processors = model._get_logits_processor(
        generation_config=generation,
        input_ids_seq_length=prompt,
        encoder_input_ids=input_ids,
        device=input_ids.device,
        model_kwargs={"attention_mask": kwargs.get("attention_mask")},  # (a penalty skips the padding)
    )
    pad_id = 0 if pad is None else int(pad)
    return FixedCachePlan(int(new), bool(generation.do_sample), eos_ids, pad_id, processors)


class FixedCache:
    """Each layer's keys and values for ``rows`` rows of up to ``length`` tokens, and the
    additive mask that hides the prompts' padding."""

    def __init__(self, prefilled: Any, rows: torch.Tensor, mask: torch.Tensor, length: int) -> None:
        self.keys, self.values = [], []
        filled = mask.shape[1]
        for layer in prefilled.layers:
            keys = layer.keys[rows]
            buffer = keys.new_empty(keys.shape[0], keys.shape[1], length, keys.shape[3])
            buffer[:, :, :filled] = keys
            self.keys.append(buffer)
            buffer = buffer.new_empty(buffer.shape)
            buffer[:, :, :filled] = layer.values[rows]
            self.values.append(buffer)
        hidden = torch.zeros(mask.shape[0], length, dtype=torch.bool, device=mask.device)
        hidden[:, :filled] = mask == 0
        dtype = self.keys[0].dtype
        self.bias = torch.zeros(hidden.shape, dtype=dtype, device=mask.device).masked_fill(
            hidden, torch.finfo(dtype).min
        )[:, None, None, :]


def rotary_function(model: Any) -> Any:
    """The model's own ``apply_rotary_pos_emb`` (from its modelling module)."""
    return sys.modules[type(model.model.layers[0].self_attn).__module__].apply_rotary_pos_emb


def decode_step(model: Any, cache: FixedCache, tokens: torch.Tensor, positions: torch.Tensor, slot: int):
    """The next-token logits of one token a row at ``positions``, its keys and values written
    at ``slot``; attention reads slots ``0..slot``."""
    base = model.model
    rotate = rotary_function(model)
    hidden = base.embed_tokens(tokens[:, None])
    cos, sin = base.rotary_emb(hidden, positions[:, None])
    rows = hidden.shape[0]
    bias = cache.bias[..., : slot + 1]
    for layer, keys, values in zip(base.layers, cache.keys, cache.values, strict=True):
        attention = layer.self_attn
        kv_heads, head_dim = keys.shape[1], keys.shape[3]
        x = layer.input_layernorm(hidden)
        query = attention.q_proj(x).view(rows, 1, -1, head_dim).transpose(1, 2)
        key = attention.k_proj(x).view(rows, 1, kv_heads, head_dim).transpose(1, 2)
        query, key = rotate(query, key, cos, sin)
        keys[:, :, slot] = key[:, :, 0]
        values[:, :, slot] = attention.v_proj(x).view(rows, kv_heads, head_dim)
        read = decode_attention(
            query, keys[:, :, : slot + 1], values[:, :, : slot + 1], bias, attention.scaling
        ).reshape(rows, 1, -1)
        hidden = hidden + attention.o_proj(read)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.get_output_embeddings()(base.norm(hidden))[:, -1]


def prefill_rows(
    model: Any, input_ids: torch.Tensor, mask: torch.Tensor
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The model's cache of each distinct row's whole prompt, every row's index among those,
    and every row's last-token logits."""
    kept, rows = distinct_rows(input_ids, mask)
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    out = model(
        input_ids=input_ids[kept],
        attention_mask=mask[kept],
        position_ids=positions[kept],
        use_cache=True,
        logits_to_keep=1,
    )
    return out.past_key_values, rows, out.logits[:, -1][rows]


@torch.no_grad()
def sample_with_fixed_cache(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, plan: FixedCachePlan
) -> torch.Tensor:
    """``generate``'s output for ``plan``: each row's prompt, then its new tokens, rows that
    ended early filled with the pad token, as long as the longest row."""
    rows, prompt = input_ids.shape
    mask = attention_mask.to(input_ids.device).long()
    prefilled, index, logits = prefill_rows(model, input_ids, mask)
    cache = FixedCache(prefilled, index, mask, prompt + plan.max_new_tokens)
    del prefilled
    out = input_ids.new_full((rows, prompt + plan.max_new_tokens), plan.pad_token_id)
    out[:, :prompt] = input_ids
    positions = mask.sum(-1) - 1
    unfinished = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
    eos = torch.tensor(plan.eos_token_ids, dtype=input_ids.dtype, device=input_ids.device)
    for step in range(plan.max_new_tokens):
        slot = prompt + step
        tokens = choose_tokens(plan, out[:, :slot], logits.float())
        tokens = torch.where(unfinished, tokens, torch.full_like(tokens, plan.pad_token_id))
        out[:, slot] = tokens
        unfinished &= ~torch.isin(tokens, eos)
        if step + 1 == plan.max_new_tokens or not bool(unfinished.any()):
            return out[:, : slot + 1]
        positions = positions + 1
        logits = decode_step(model, cache, tokens, positions, slot)
    return out


def choose_tokens(plan: FixedCachePlan, sequences: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The next token of every row: drawn from the processed logits' softmax, or their argmax."""
    scores = plan.processors(sequences, logits)
    if not plan.do_sample:
        return scores.argmax(-1)
    # torch.multinomial by name: under cpu_decoding that is its faster categorical draw
    return torch.multinomial(torch.softmax(scores, dim=-1), 1)[:, 0]


def fixed_cache_decoding(model: Any) -> contextlib.AbstractContextManager[Any]:
    """While inside, ``model.generate(input_ids=..., attention_mask=..., generation_config=...)``
    samples through :func:`sample_with_fixed_cache` where :func:`fixed_cache_plan` allows;
    every other call goes to the ``generate`` in place on entry."""

    def wrap(plain: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
            if args or ids is None or mask is None:
                return plain(*args, **kwargs)
            plan = fixed_cache_plan(model, ids, kwargs)
            if plan is None:
                return plain(*args, **kwargs)
            return sample_with_fixed_cache(model, ids, mask, plan)

        return generate

    return generate_wrapped(model, wrap)
