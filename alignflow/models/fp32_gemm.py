"""fp32 matrix products through oneDNN where it beats the BLAS that torch calls.

torch sends a CPU fp32 ``mm`` to MKL, and MKL takes a slower code path on AMD processors: on an
AMD EPYC (Zen 5, 2 cores) MKL ran [640, 576] x [576, 2048] at ~185 GFLOP/s and oneDNN, which
torch already ships for its bf16 products, at ~420, with the same fp32 result up to summation
order. Which library wins is measured once per process, as for the CPU's dtype, rather than
read off the vendor string.

A product whose fp32 operands hold bf16 values (a bf16 model's hidden states against its bf16
head, widened) can also run in oneDNN's bf16 math mode: the operands narrow to bf16 unchanged,
the sums stay fp32, the result is the fp32 product up to summation order, and a CPU with bf16
matrix units computes it several times faster (AMX Xeon, 2 cores: ~120 -> ~500 GFLOP/s).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from alignflow.models.call_rate import best_calls_per_second

ONEDNN_MARGIN = 1.2  # oneDNN must beat torch's own fp32 product by this much to be used
PROBE_SECONDS = 0.1  # per library
PROBE_SHAPE = (512, 576, 2048)  # rows, inner, columns: a label head's block on a small LM
# a layer with fewer weights keeps torch's product: it is over in microseconds, and on the demo's
# 128-wide model the switch gained nothing while moving its losses in the third decimal
MIN_LAYER_WEIGHTS = 2**17


def _onednn_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


@functools.cache
def onednn_fp32_faster() -> bool:
    """True where oneDNN's fp32 product is available, agrees with torch's and is clearly faster."""
    if not torch.backends.mkldnn.is_available():
        return False
    rows, inner, columns = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=generator)
    w = torch.randn(columns, inner, generator=generator)
    try:
        agrees = torch.allclose(_onednn_product(x, w), x @ w.T, rtol=1e-4, atol=1e-3)
    except RuntimeError:  # a torch built without the op
        return False
    if not agrees:
        return False
    with torch.no_grad():
        onednn = best_calls_per_second(lambda: _onednn_product(x, w), PROBE_SECONDS)
        return onednn >= ONEDNN_MARGIN * best_calls_per_second(lambda: x @ w.T, PROBE_SECONDS)


@contextlib.contextmanager
def _bf16_math() -> Iterator[None]:
    """fp32 matmuls on the CPU narrow their operands to bf16 (fp32 sums, fp32 result)."""
    matmul: Any = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]  # (set at import)
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def _bf16_math_narrows(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the mode really multiplies in bf16 here: its product of fp32 operands is nearer
    the product of their bf16 roundings than the fp32 product. Where torch's oneDNN does not
    take the mode (seen on an AMD EPYC Zen 4 without AMX) it is a no-op, and a speed probe
    would time the fp32 product against itself: noise that once passed for a 1.2x gain."""
    plain = x @ w.T
    rounded = x.bfloat16().float() @ w.bfloat16().float().T
    with _bf16_math():
        narrowed = x @ w.T
    return bool((narrowed - rounded).abs().max() < (narrowed - plain).abs().max())


@functools.cache
def bf16_math_faster() -> bool:
    """True where the bf16 math mode is live here and multiplies bf16-valued fp32 operands to
    the fp32 product (same result up to summation order) clearly faster than the fastest fp32
    product."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.backends.mkldnn, "matmul"):
        return False
    rows, inner, columns = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    raw_x = torch.randn(rows, inner, generator=generator)
    raw_w = torch.randn(columns, inner, generator=generator)
    x, w = raw_x.bfloat16().float(), raw_w.bfloat16().float()
    with torch.no_grad():
        try:
            if not _bf16_math_narrows(raw_x, raw_w):
                return False
            with _bf16_math():
                agrees = torch.allclose(x @ w.T, fp32_linear(x, w), rtol=1e-4, atol=1e-3)
        except (RuntimeError, AttributeError, ValueError):  # a torch without the setting
            return False
        if not agrees:
            return False
        fp32 = best_calls_per_second(lambda: fp32_linear(x, w), PROBE_SECONDS)
        with _bf16_math():
            return best_calls_per_second(lambda: x @ w.T, PROBE_SECONDS) >= ONEDNN_MARGIN * fp32


def _untracked_cpu_fp32(x: torch.Tensor, w: torch.Tensor) -> bool:
    """fp32 CPU operands of a product autograd does not track (the faster paths have no gradient)."""
    tracked = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    return x.dtype == w.dtype == torch.float32 and x.device.type == "cpu" and not tracked


def bf16_valued_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for fp32 CPU tensors that hold bf16 values (the caller vouches for it): in
    the bf16 math mode where that is faster here, otherwise as :func:`fp32_linear`."""
    if _untracked_cpu_fp32(x, w) and bf16_math_faster():
        with _bf16_math():
            return x @ w.T
    return fp32_linear(x, w)


def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for 2-D fp32 CPU tensors, by whichever library is faster here; a product that
    autograd must track stays torch's (the oneDNN call has no gradient of its own)."""
    if _untracked_cpu_fp32(x, w) and onednn_fp32_faster():
        return _onednn_product(x.contiguous(), w.contiguous())
    return x @ w.T


class _OneDnnLinear(torch.autograd.Function):
    """``F.linear`` in fp32 with its three products (output, input and weight gradients) on oneDNN."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        ctx.input_shape, ctx.has_bias = x.shape, bias is not None
        return _onednn_product(rows, weight, bias).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, weight = ctx.saved_tensors
        grad = grad.reshape(-1, weight.shape[0])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_product(grad, weight.T).reshape(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            grad_w = _onednn_product(grad.T, rows.T)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


class OneDnnLinear(torch.nn.Linear):
    """A ``Linear`` whose fp32 CPU products run on oneDNN (outside autocast, which picks its own
    dtype); anything else takes ``Linear``'s own path. Same parameters, same state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.dtype == self.weight.dtype == torch.float32
            and x.device.type == "cpu"
            and self.weight.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu")
        ):
            return _OneDnnLinear.apply(x, self.weight, self.bias)
        return super().forward(x)


def use_onednn_linears(model: Any) -> int:
    """Switch ``model``'s plain fp32 ``Linear`` layers on a CPU to :class:`OneDnnLinear` where
    oneDNN is the faster library here; returns how many were switched. Small layers
    (:data:`MIN_LAYER_WEIGHTS`) and layers of another class (quantised, LoRA wrappers) keep
    theirs; the plain layers inside a wrapper are switched."""
    linears = [
        module
        for module in model.modules()
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
        if module.weight.device.type == "cpu" and module.weight.numel() >= MIN_LAYER_WEIGHTS
    ]
    if not linears or not onednn_fp32_faster():
        return 0
    for module in linears:
        module.__class__ = OneDnnLinear
    return len(linears)
