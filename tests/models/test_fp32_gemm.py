"""fp32 products give torch's own result whichever library computes them."""

from __future__ import annotations

import contextlib

import pytest
import torch

from alignflow.models import fp32_gemm
from alignflow.models.fp32_gemm import OneDnnLinear, fp32_linear, use_onednn_linears


@pytest.mark.parametrize("use_onednn", [True, False])
def test_the_product_matches_torchs_whichever_library_runs_it(monkeypatch, use_onednn):
    if use_onednn and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: use_onednn)
    calls = []
    real = fp32_gemm._onednn_product
    monkeypatch.setattr(fp32_gemm, "_onednn_product", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    x, w = torch.randn(37, 50), torch.randn(300, 100)[:, ::2]  # a strided weight, as a slice can be
    torch.testing.assert_close(fp32_linear(x, w), x @ w.T, rtol=1e-5, atol=1e-4)
    assert bool(calls) == use_onednn
    calls.clear()
    half = fp32_linear(x.bfloat16(), w.bfloat16())  # not fp32: torch's own product
    assert half.dtype == torch.bfloat16 and not calls
    tracked = fp32_linear(x, w.clone().requires_grad_(True))  # autograd needs torch's product
    assert tracked.grad_fn is not None and not calls


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 256, bias=False),
        torch.nn.Linear(256, 4),
    )


def test_switched_layers_give_torchs_outputs_and_gradients_and_keep_their_state_dict(monkeypatch):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: True)
    ours, theirs = _mlp(), _mlp()
    ours[2].weight.requires_grad_(False)  # a frozen layer: no weight gradient asked for
    theirs[2].weight.requires_grad_(False)
    assert use_onednn_linears(ours) == 2  # the 256 x 4 head is below the size worth switching
    assert [type(m) for m in ours] == [OneDnnLinear, torch.nn.GELU, OneDnnLinear, torch.nn.Linear]
    assert ours.state_dict().keys() == theirs.state_dict().keys()

    x = torch.randn(3, 7, 512)
    results = []
    for model in (ours, theirs):
        rows = x.clone().requires_grad_(True)
        out = model(rows)
        out.square().sum().backward()
        results.append((out, rows.grad, [p.grad for p in model.parameters() if p.requires_grad]))
    (out, grad, params), (their_out, their_grad, their_params) = results
    for mine, torchs in zip([out, grad, *params], [their_out, their_grad, *their_params], strict=True):
        assert (mine - torchs).norm() <= 1e-5 * torchs.norm()  # fp32 up to summation order
    assert ours[2].weight.grad is None

    with torch.no_grad():  # an optimiser step updates the weights in place: no stale copy is used
        ours[0].weight.mul_(0.5)
        theirs[0].weight.mul_(0.5)
        mine, torchs = ours(x), theirs(x)
    assert (mine - torchs).norm() <= 1e-5 * torchs.norm()

    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast picks the dtype, as for Linear
        assert ours[0](x).dtype == theirs[0](x).dtype == torch.bfloat16


def test_nothing_is_switched_where_onednn_is_not_faster(monkeypatch):
    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: False)
    model = _mlp()
    assert use_onednn_linears(model) == 0 and type(model[0]) is torch.nn.Linear


def test_the_fp32_peak_is_measured_on_the_library_the_stages_use(monkeypatch):
    from alignflow.models import gemm_rate

    monkeypatch.setattr(fp32_gemm, "onednn_fp32_faster", lambda: True)
    monkeypatch.setitem(gemm_rate.PROBE_SECONDS, "cpu", 0.01)
    calls = []
    real = fp32_gemm._onednn_product
    monkeypatch.setattr(fp32_gemm, "_onednn_product", lambda *a: calls.append(1) or real(*a))
    gemm_rate.peak_gflops.cache_clear()
    try:
        assert gemm_rate.peak_gflops("float32", "cpu") > 0 and calls
        calls.clear()
        assert gemm_rate.peak_gflops("bfloat16", "cpu") > 0 and not calls
    finally:
        gemm_rate.peak_gflops.cache_clear()


@pytest.mark.parametrize("bf16_math", [True, False])
def test_bf16_valued_operands_give_the_fp32_product_in_either_mode(monkeypatch, bf16_math):
    monkeypatch.setattr(fp32_gemm, "bf16_math_faster", lambda: bf16_math)
    torch.manual_seed(0)
    x = (torch.randn(64, 96) * 3).bfloat16().float()
    w = torch.randn(200, 96).bfloat16().float()
    exact = (x.double() @ w.double().T).float()
    torch.testing.assert_close(fp32_gemm.bf16_valued_linear(x, w), exact, rtol=1e-5, atol=1e-4)
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"  # the mode ends with the product


def test_bf16_math_on_operands_that_are_not_bf16_values_would_round(monkeypatch):
    """Why the caller must vouch for its operands: fp32 values lose their low bits in bf16 math."""
    if not fp32_gemm.bf16_math_faster():
        pytest.skip("this CPU ignores the bf16 math mode or runs no faster in it: never used here")
    torch.manual_seed(0)
    x, w = torch.randn(64, 96), torch.randn(200, 96)
    exact = x.double() @ w.double().T
    assert (fp32_gemm.bf16_valued_linear(x, w).double() - exact).abs().max() > 1e-3


def test_a_mode_that_does_not_narrow_is_never_chosen_however_it_times(monkeypatch):
    """Where torch ignores the mode (an AMD EPYC Zen 4), its probe timed the fp32 product against
    itself, and under load that once read as a 1.2x gain."""
    monkeypatch.setattr(fp32_gemm, "_bf16_math", contextlib.nullcontext)
    rates = iter([1.0, 10.0])  # the fp32 product, then the mode: ten times faster
    monkeypatch.setattr(fp32_gemm, "best_calls_per_second", lambda call, seconds: next(rates))
    fp32_gemm.bf16_math_faster.cache_clear()
    try:
        assert fp32_gemm.bf16_math_faster() is False
    finally:
        fp32_gemm.bf16_math_faster.cache_clear()


@pytest.mark.parametrize(
    ("probe", "product"), [("onednn_fp32_faster", "_onednn_product"), ("bf16_math_faster", "fp32_linear")]
)
def test_a_faster_path_whose_product_disagrees_is_never_chosen(monkeypatch, probe, product):
    # onednn's product against torch's; the bf16 math mode against the fp32 product
    real = getattr(fp32_gemm, product)
    monkeypatch.setattr(fp32_gemm, product, lambda x, w: real(x, w) * 1.01)
    chooses = getattr(fp32_gemm, probe)
    chooses.cache_clear()
    try:
        assert chooses() is False
    finally:
        chooses.cache_clear()
