"""One decoding step's attention on a CPU: one query token a row over a cache of grouped keys,
by whichever kernel is faster on this CPU.

The two kernels trade places between CPUs. On an AMX Xeon (family 6 model 207) torch's fused
SDPA read the grouped keys in place at 86 us a layer (SmolLM2, 16 rows, ~100 keys) against
259 us for two bf16 matmuls and a softmax. On an AMD EPYC Zen 5 (family 26 model 2, AVX-512
bf16, no AMX) the same SDPA took 1,001 us at 160 keys and the matmuls 189 us, which made
sampling through the fixed cache slower than transformers' own loop there (64 HH-RLHF prompts
x 40 greedy tokens: 15-16 s against 10). :func:`matmuls_faster` times both once per process
at a decoding step's shape and :func:`decode_attention` takes the faster one.
"""

from __future__ import annotations

import functools

import torch

from alignflow.models.call_rate import best_calls_per_second

PROBE_ROWS, PROBE_KEYS = 16, 256  # a batch of sampled rows some way into its answers
PROBE_SECONDS = 0.05  # per kernel


Tensor = torch.Tensor


def sdpa_step(query: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float) -> Tensor:
    """torch's fused attention, the grouped keys read in place: [rows, heads, 1, dim]."""
    return torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=bias, scale=scale, enable_gqa=True
    )


def matmul_step(query: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float) -> Tensor:
    """The query heads that share a key/value head as the rows of one product against it,
    softmax in fp32: [rows, heads, 1, dim], as :func:`sdpa_step` returns it."""
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, keys.transpose(2, 3)) * scale + bias
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(weights, values).reshape(rows, heads, 1, dim)


@functools.cache
def matmuls_faster(dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> bool:
    """Whether :func:`matmul_step` runs a decoding step's attention faster than
    :func:`sdpa_step` here, for a model with these heads in ``dtype`` (timed once per process)."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(PROBE_ROWS, heads, 1, dim, generator=generator).to(dtype)
    # a slice of a longer buffer, as the fixed cache's keys are read
    keys = torch.randn(PROBE_ROWS, kv_heads, 2 * PROBE_KEYS, dim, generator=generator).to(dtype)
    values = torch.randn(keys.shape, generator=generator).to(dtype)
    keys, values = keys[:, :, :PROBE_KEYS], values[:, :, :PROBE_KEYS]
    bias = torch.zeros(PROBE_ROWS, 1, 1, PROBE_KEYS, dtype=dtype)
    scale = dim**-0.5
    with torch.no_grad():
        fused = best_calls_per_second(lambda: sdpa_step(query, keys, values, bias, scale), PROBE_SECONDS)
        plain = best_calls_per_second(lambda: matmul_step(query, keys, values, bias, scale), PROBE_SECONDS)
    return plain > fused


def decode_attention(query: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float) -> Tensor:
    """Attention of ``query`` [rows, heads, 1, dim] over ``keys``/``values`` [rows, kv heads,
    length, dim] with the additive ``bias`` [rows, 1, 1, length]: [rows, heads, 1, dim]."""
    heads, kv_heads, dim = query.shape[1], keys.shape[1], query.shape[3]
    faster = query.device.type == "cpu" and matmuls_faster(query.dtype, heads, kv_heads, dim)
    return (matmul_step if faster else sdpa_step)(query, keys, values, bias, scale)
