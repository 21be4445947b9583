"""Attention for a compiled training step on a CPU: SDPA's flash forward, a matmul backward.

torch's CPU flash-attention kernel computes a forward well but its backward slowly: on SmolLM2
(DPO, bf16, 16 rows x ~220 tokens, 9 heads, an AMX Xeon with 2 cores) 8 ms forward and 37 ms
backward a layer, 28% of a compiled DPO step. The backward can be written as five matmuls and a
few elementwise passes over the [rows, heads, queries, keys] weights, recomputed from the
forward's log-sum-exp; compiled with the layer (inductor fuses the elementwise passes) it took
18 ms, the same gradients within bf16's rounding. Eager, those passes cost more than they save
(63 ms), so :func:`~alignflow.models.cpu_attention.grouped_attention` takes this path only while
the layer is being compiled.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import repeat_kv

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class _FlashForwardMatmulBackward(torch.autograd.Function):
    """out = softmax(q kᵀ scale + mask) v: flash forward (keeps only the log-sum-exp), the
    backward from the weights recomputed with it."""

    @staticmethod
    def forward(ctx: Any, query, key, value, mask, scale: float):
        out, lse = _flash(query, key, value, 0.0, False, attn_mask=mask, scale=scale)
        ctx.save_for_backward(query, key, value, out, lse, mask)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out):
        query, key, value, out, lse, mask = ctx.saved_tensors
        scores = torch.matmul(query, key.transpose(-1, -2)).float() * ctx.scale
        if mask is not None:
            scores = scores + mask
        weights = torch.exp(scores - lse.unsqueeze(-1))  # fp32, as the forward normalised them
        grad_out = grad_out.contiguous()
        grad_value = torch.matmul(weights.to(value.dtype).transpose(-1, -2), grad_out)
        grad_weights = torch.matmul(grad_out, value.transpose(-1, -2)).float()
        row_dot = (grad_out.float() * out.float()).sum(-1, keepdim=True)
        grad_scores = (weights * (grad_weights - row_dot) * ctx.scale).to(query.dtype)
        grad_query = torch.matmul(grad_scores, key)
        grad_key = torch.matmul(grad_scores.transpose(-1, -2), query)
        return grad_query, grad_key, grad_value, None, None


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """SDPA's bool mask (True reads) as the additive one the flash kernel takes, in ``dtype``
    (masked at its minimum, so a row with nothing to read stays finite, as SDPA's does)."""
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def flash_forward_matmul_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of ``query`` [batch, heads, q, dim] over ``key``/``value`` [batch, kv heads,
    keys, dim] (each key/value head serving its group of query heads), ``mask`` SDPA's
    [batch, 1, q, keys] (bool or additive) or None for no mask; [batch, heads, q, dim]."""
    group = query.shape[1] // key.shape[1]  # the kernel wants one key/value head per query head
    key, value = repeat_kv(key, group), repeat_kv(value, group)
    return _FlashForwardMatmulBackward.apply(query, key, value, additive_mask(mask, query.dtype), scale)
