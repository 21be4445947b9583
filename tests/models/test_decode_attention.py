"""A decoding step's attention: both kernels compute the same thing, and the step takes the one
the probe found faster on this CPU."""

from __future__ import annotations

import pytest
import torch

from alignflow.models import decode_attention
from alignflow.models.decode_attention import decode_attention as attend
from alignflow.models.decode_attention import matmul_step, matmuls_faster, sdpa_step


def _step_inputs(dtype: torch.dtype, rows: int = 5, heads: int = 6, kv_heads: int = 2, keys: int = 37):
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(rows, heads, 1, 16, generator=generator).to(dtype)
    # keys read as a slice of a longer buffer, as the fixed cache holds them
    buffer = torch.randn(rows, kv_heads, keys + 11, 16, generator=generator).to(dtype)
    values = torch.randn(buffer.shape, generator=generator).to(dtype)
    bias = torch.zeros(rows, 1, 1, keys, dtype=dtype)
    bias[1, ..., :9] = torch.finfo(dtype).min  # a left-padded row: its first keys are hidden
    return query, buffer[:, :, :keys], values[:, :, :keys], bias


def test_the_matmul_kernel_computes_sdpa_s_attention_grouped_heads_and_padding_alike():
    query, keys, values, bias = _step_inputs(torch.float32)
    expected = sdpa_step(query, keys, values, bias, 0.25)
    assert torch.allclose(matmul_step(query, keys, values, bias, 0.25), expected, atol=1e-5)
    # the padded keys are not read: changing them changes nothing
    keys[1, :, :9] = 100.0
    assert torch.allclose(matmul_step(query, keys, values, bias, 0.25), expected, atol=1e-5)


def test_in_bf16_the_kernels_differ_only_by_rounding():
    query, keys, values, bias = _step_inputs(torch.bfloat16)
    plain = matmul_step(query, keys, values, bias, 0.25).float()
    fused = sdpa_step(query, keys, values, bias, 0.25).float()
    assert (plain - fused).abs().max() < 0.03


@pytest.mark.parametrize("faster", [True, False])
def test_the_step_takes_the_kernel_the_probe_chose(monkeypatch, faster):
    called = []
    monkeypatch.setattr(decode_attention, "matmuls_faster", lambda *shape: faster)

    def counted(name, kernel):
        return lambda *args: called.append(name) or kernel(*args)

    monkeypatch.setattr(decode_attention, "matmul_step", counted("matmuls", matmul_step))
    monkeypatch.setattr(decode_attention, "sdpa_step", counted("sdpa", sdpa_step))
    attend(*_step_inputs(torch.float32), 0.25)
    assert called == ["matmuls" if faster else "sdpa"]


def test_the_probe_times_both_kernels_and_picks_the_faster(monkeypatch):
    rates = {"sdpa_step": 100.0, "matmul_step": 300.0}

    def rate_of(call, seconds):
        return rates[call.__code__.co_names[0]]

    monkeypatch.setattr(decode_attention, "best_calls_per_second", rate_of)
    matmuls_faster.cache_clear()
    try:
        assert matmuls_faster(torch.float32, 6, 2, 16) is True
        rates["sdpa_step"] = 900.0
        matmuls_faster.cache_clear()
        assert matmuls_faster(torch.float32, 6, 2, 16) is False
    finally:
        matmuls_faster.cache_clear()
