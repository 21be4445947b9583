"""SDPA's flash forward with a matmul backward: SDPA's outputs and gradients (against fp64),
taken by the CPU attention only inside a compiled training forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from alignflow.models import cpu_attention
from alignflow.models.matmul_backward_attention import additive_mask, flash_forward_matmul_backward

BATCH, HEADS, KV_HEADS, LENGTH, DIM = 3, 6, 2, 20, 16


def _inputs(dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(BATCH, heads, LENGTH, DIM, generator=generator).to(dtype).requires_grad_()

    return draw(HEADS), draw(KV_HEADS), draw(KV_HEADS)


def _padded_causal_mask() -> torch.Tensor:
    """[batch, 1, q, keys] bool: causal, row 1 left-padded by 5 (its first queries read nothing)."""
    keys = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    keys[1, :5] = False
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    return (causal[None] & keys[:, None, :])[:, None]


def _reference(query, key, value, mask, scale):
    """SDPA in fp64 with every key/value head repeated for its query heads."""
    group = HEADS // KV_HEADS
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    additive = additive_mask(mask, query.dtype)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=additive, scale=scale)


def _grads(fn, inputs, grad_out):
    out = fn(*inputs)
    out.backward(grad_out)
    grads = [t.grad.detach().clone() for t in inputs]
    for t in inputs:
        t.grad = None
    return out.detach(), grads


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_and_gradients_are_sdpas_within_its_own_rounding(dtype):
    mask, scale = _padded_causal_mask(), DIM**-0.5
    inputs = _inputs(dtype)
    grad_out = torch.randn(BATCH, HEADS, LENGTH, DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    exact = [t.detach().double().requires_grad_() for t in inputs]
    want_out, want = _grads(lambda q, k, v: _reference(q, k, v, mask, scale), exact, grad_out.double())
    _, sdpa = _grads(lambda q, k, v: _reference(q, k, v, mask, scale), inputs, grad_out)
    ours_out, ours = _grads(
        lambda q, k, v: flash_forward_matmul_backward(q, k, v, mask, scale), inputs, grad_out
    )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert _relative_error(ours_out, want_out) < tolerance
    for name, mine, theirs, exact_grad in zip("qkv", ours, sdpa, want, strict=True):
        assert torch.isfinite(mine).all(), name
        # no further from the exact gradient than SDPA's own kernel is, give or take rounding
        bound = max(2 * _relative_error(theirs, exact_grad), tolerance)
        assert _relative_error(mine, exact_grad) < bound, name


def test_the_cpu_attention_takes_it_only_inside_a_compiled_training_forward(monkeypatch):
    taken = []
    real = cpu_attention.flash_forward_matmul_backward
    monkeypatch.setattr(
        cpu_attention, "flash_forward_matmul_backward", lambda *a: taken.append(1) or real(*a)
    )
    monkeypatch.setattr(cpu_attention, "MATMUL_TRAINING_SCORES", 0)  # past plain matmuls' limit
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, HEADS // KV_HEADS
    mask = _padded_causal_mask()

    def attend(query, key, value):
        return cpu_attention.grouped_attention(module, query, key, value, mask)[0]

    inputs = _inputs(torch.float32)
    eager = attend(*inputs)
    assert taken == []  # eager: SDPA's own kernels
    compiled = torch.compile(attend, dynamic=True, fullgraph=True)(*inputs)
    assert taken  # traced into the compiled graph
    # a query with nothing to read (row 1's padding) is nobody's input: SDPA gives it zeros here
    reads = mask.any(-1)[:, 0, :, None, None].expand_as(eager)  # [batch, q] as the output's rows
    torch.testing.assert_close(compiled[reads], eager[reads], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch._dynamo.reset()
        taken.clear()
        torch.compile(attend, dynamic=True)(*inputs)
    assert taken == []  # nothing to differentiate: SDPA
