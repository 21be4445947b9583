"""fp32 products give torch's own result whichever library computes them."""

from __future__ import annotations

import pytest
import torch

from alignflow.models import fp32_gemm
from alignflow.models.fp32_gemm import fp32_linear


@pytest.mark.parametrize("use_onednn", [True, False])
def test_the_product_matches_torchs_whichever_library_runs_it(monkeypatch, use_onednn):
    if use_onednn and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: use_onednn)
    calls = []
    real = fp32_gemm._onednn_product
    monkeypatch.setattr(fp32_gemm, "_onednn_product", lambda x, w: calls.append(1) or real(x, w))
    torch.manual_seed(0)
    x, w = torch.randn(37, 50), torch.randn(300, 100)[:, ::2]  # a strided weight, as a slice can be
    torch.testing.assert_close(fp32_linear(x, w), x @ w.T, rtol=1e-5, atol=1e-4)
    assert bool(calls) == use_onednn
    calls.clear()
    half = fp32_linear(x.bfloat16(), w.bfloat16())  # not fp32: torch's own product
    assert half.dtype == torch.bfloat16 and not calls


def test_a_library_that_disagrees_with_torch_is_never_chosen(monkeypatch):
    real = fp32_gemm._onednn_product
    monkeypatch.setattr(fp32_gemm, "_onednn_product", lambda x, w: real(x, w) * 1.01)
    fp32_gemm.onednn_fp32_faster.cache_clear()
    try:
        assert fp32_gemm.onednn_fp32_faster() is False
    finally:
        fp32_gemm.onednn_fp32_faster.cache_clear()
