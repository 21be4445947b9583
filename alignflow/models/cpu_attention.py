"""Attention on a CPU as plain matmuls over the key/value heads as stored.

Profiled on SmolLM2-135M (bf16, 16 sequences, 2 Zen 5 cores), a sampled decoding step took
72 ms, ~15 of them in SDPA's kernel, which is slow for one query token; plain matmul
attention (transformers' "eager") took the step to 62 ms, but it repeats every key/value
head for each query head it serves (SmolLM2: 3 query heads per key/value head) and computes
a long prompt's prefill as a full score matrix, slower than SDPA's there (16 x 400-token
prompts + 40 greedy tokens: 9.1 s against SDPA's 8.8). Training fares the same: SDPA's CPU
flash kernel took 40 ms a layer for the forward and backward of GRPO's 16 x 113 tokens on 2
Zen 4 cores, plain matmuls 21 ms; at 256 tokens the two were even.

:data:`CPU_ATTENTION` takes the better of each: plain matmuls over the key/value heads as
they are stored, each serving its group of query heads without a copy, for every decoding
step and for prefills and training forwards up to :data:`MATMUL_ATTENTION_TOKENS` keys; SDPA
for longer ones. :func:`use_cpu_attention` switches a model on a CPU to it for training;
:func:`alignflow.models.decoding.cpu_decoding` while it generates.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from alignflow.models.matmul_backward_attention import flash_forward_matmul_backward

CPU_ATTENTION = "alignflow_cpu_attention"
MATMUL_ATTENTION_TOKENS = 256  # the longest keys plain matmuls attend over faster than SDPA here
# a training forward keeps each layer's [rows, heads, queries, keys] weights for its backward
# (SDPA's flash kernel keeps none): past this many entries a layer, SDPA, to bound the memory
MATMUL_TRAINING_SCORES = 4_000_000
# a compiled backward recomputes a layer's weights in fp32 (a few such tensors at once): up to
# this many entries (64 MB each), else SDPA's own backward
MATMUL_BACKWARD_SCORES = 16_000_000


def _causal(queries: int, keys: int, device: torch.device | None = None) -> torch.Tensor:
    """[queries, keys] bool: each query reads the keys up to its own position (the last
    ``queries`` of the ``keys``)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)


def _mask_of(module: Any, attention_mask: torch.Tensor | None, query: torch.Tensor, keys: int):
    """The mask a call attends with: the one given, or a causal one where none is and the
    module is causal over more than one query."""
    q_len = query.shape[2]
    if attention_mask is None and q_len > 1 and getattr(module, "is_causal", True):
        return _causal(q_len, keys, query.device)
    return attention_mask


def matmuls_win(module: Any, query: torch.Tensor, key: torch.Tensor, dropout: float) -> bool:
    """Whether :func:`grouped_attention` computes this call with plain matmuls
    (:func:`kernel_choice`); never with dropout (SDPA applies it)."""
    if module.training and dropout:
        return False
    keeps_weights = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    choice = kernel_choice(query.shape[0], query.shape[1], query.shape[2], key.shape[2], keeps_weights)
    return choice in MATMUL_CHOICES


MATMUL_CHOICES = frozenset({"decoding step", "matmuls"})


def kernel_choice(batch: int, heads: int, queries: int, keys: int, keeps_weights: bool) -> str:
    """How attention of these sizes runs, and why: plain matmuls for every decoding step and for
    a prefill or training forward over at most :data:`MATMUL_ATTENTION_TOKENS` keys that, where
    it keeps its weights for a backward, keeps at most :data:`MATMUL_TRAINING_SCORES` of them a
    layer; else SDPA ("long keys" or "many scores", each a branch a compiled layer guards on)."""
    if queries == 1:
        return "decoding step"
    if keys > MATMUL_ATTENTION_TOKENS:
        return "long keys"
    if keeps_weights and batch * heads * queries * keys > MATMUL_TRAINING_SCORES:
        return "many scores"
    return "matmuls"


def backward_by_matmuls(query: torch.Tensor, key: torch.Tensor, dropout: float) -> bool:
    """Whether a forward SDPA would take keeps its weights for a backward that is being
    compiled now, and is small enough to recompute them in it
    (:mod:`~alignflow.models.matmul_backward_attention`)."""
    if dropout or not torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    if not (query.requires_grad or key.requires_grad):
        return False
    return query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2] <= MATMUL_BACKWARD_SCORES


def grouped_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for ``query`` [batch, heads, q, dim] over ``key``/``value`` [batch, kv heads,
    length, dim], output [batch, q, heads, dim] as transformers' attention functions return it.

    The query heads that share a key/value head are stacked as rows of one matmul against it,
    softmax in fp32 as eager attention does, masked positions at the dtype's minimum (a
    padding row reads uniformly rather than NaN). SDPA instead where it wins or where the
    weights would take too much memory (:func:`matmuls_win`); in a compiled training forward
    SDPA's flash forward with a matmul backward (:func:`backward_by_matmuls`).
    """
    q_len, kv_len = query.shape[2], key.shape[2]
    batch, heads, _, dim = query.shape
    scale = dim**-0.5 if scaling is None else scaling
    if not matmuls_win(module, query, key, dropout):
        if not backward_by_matmuls(query, key, dropout):
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        mask = _mask_of(module, attention_mask, query, kv_len)
        out = flash_forward_matmul_backward(query, key, value, mask, scale)
        return out.transpose(1, 2).contiguous(), None
    mask = _mask_of(module, attention_mask, query, kv_len)
    kv_heads = key.shape[1]
    group = heads // kv_heads
    # query head h reads kv head h // group: its rows follow the group's other heads' rows
    grouped = query.reshape(batch, kv_heads, group * q_len, dim)
    scores = (torch.matmul(grouped, key.transpose(2, 3)) * scale).view(batch, kv_heads, group, q_len, kv_len)
    if mask is not None:  # SDPA's: [batch, 1, q, length] bool (True reads) or additive
        mask = mask.unsqueeze(2) if mask.dim() == 4 else mask
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights.view(batch, kv_heads, group * q_len, kv_len), value)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(CPU_ATTENTION, grouped_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_ATTENTION, sdpa_mask)


SWITCHABLE = ("sdpa", "eager")  # the implementations this one computes the same as


def attention_of(model: Any) -> str | None:
    """The attention implementation ``model`` (or a PEFT wrapper's base model) runs now."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def use_cpu_attention(model: Any) -> bool:
    """Switch ``model`` (a PEFT wrapper's base model alike) to :data:`CPU_ATTENTION` where it
    is on a CPU and runs SDPA or eager attention through transformers' attention interface;
    whether it now uses it. Its saved config keeps no trace of the switch."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu":
        return False
    attention = attention_of(model)
    if attention == CPU_ATTENTION:
        return True
    if attention not in SWITCHABLE or not getattr(_base(model), "_supports_attention_backend", False):
        return False
    _base(model).set_attn_implementation(CPU_ATTENTION)
    return True


def restore_attention(model: Any, attention: str | None) -> None:
    """Undo :func:`use_cpu_attention`: ``model`` back to ``attention``."""
    if attention is not None and attention_of(model) != attention:
        _base(model).set_attn_implementation(attention)
