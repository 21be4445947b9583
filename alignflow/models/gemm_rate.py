"""The GEMM rate a device reaches here and now: one probe for the MFU of a stage's cost and
for the dtype ``model.dtype: fastest`` picks on a CPU, so both read the same measurement."""

from __future__ import annotations

import functools
import time

PROBE_SECONDS = 0.5


@functools.cache
def peak_gflops(dtype: str, device: str) -> float:
    """The GEMM rate one device reaches here and now, in GFLOP/s: square matmuls in ``dtype``
    (a torch dtype name) on ``device`` for :data:`PROBE_SECONDS`. Measured once per process,
    beside the training it is compared with (same machine, same load, same torch settings)
    rather than taken from a datasheet the machine may not reach."""
    import torch

    from alignflow.models.fp32_gemm import fp32_linear

    on = torch.device(device)
    size = 4096 if on.type == "cuda" else 1024
    a, b = (torch.randn(size, size, device=on).to(getattr(torch, dtype)) for _ in range(2))
    sync = torch.cuda.synchronize if on.type == "cuda" else (lambda: None)
    repeats = 10 if on.type == "cuda" else 1  # a sync per launch would time the launches
    # fp32 on a CPU: the library the stages' fp32 products use (oneDNN where it is faster)
    multiply = (lambda: fp32_linear(a, b)) if on.type == "cpu" and dtype == "float32" else (lambda: a @ b)
    multiply()  # the first product picks kernels and allocates: not timed
    sync()
    runs, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < PROBE_SECONDS:
        for _ in range(repeats):
            multiply()
        sync()
        runs += repeats
    return 2 * size**3 * runs / elapsed / 1e9
