"""fp32 matrix products through oneDNN where it beats the BLAS that torch calls.

torch sends a CPU fp32 ``mm`` to MKL, and MKL takes a slower code path on AMD processors: on an
AMD EPYC (Zen 5, 2 cores) MKL ran [640, 576] x [576, 2048] at ~185 GFLOP/s and oneDNN, which
torch already ships for its bf16 products, at ~420, with the same fp32 result up to summation
order. Which library wins is measured once per process, as for the CPU's dtype, rather than
read off the vendor string.
"""

from __future__ import annotations

import functools
import time

import torch

ONEDNN_MARGIN = 1.2  # oneDNN must beat torch's own fp32 product by this much to be used
PROBE_SECONDS = 0.1  # per library
PROBE_SHAPE = (512, 576, 2048)  # rows, inner, columns: a label head's block on a small LM


def _onednn_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def _rate(product, x: torch.Tensor, w: torch.Tensor) -> float:
    product(x, w)  # kernels picked and memory allocated: not timed
    runs, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < PROBE_SECONDS:
        product(x, w)
        runs += 1
    return runs / elapsed


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
        return _rate(_onednn_product, x, w) >= ONEDNN_MARGIN * _rate(lambda a, b: a @ b.T, x, w)


def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for 2-D fp32 CPU tensors outside autograd, by whichever library is faster here."""
    if x.dtype == w.dtype == torch.float32 and x.device.type == "cpu" and onednn_fp32_faster():
        return _onednn_product(x.contiguous(), w.contiguous())
    return x @ w.T
