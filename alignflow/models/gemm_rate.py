"""The GEMM rate a device reaches here and now: one probe for the MFU of a stage's cost and
for the dtype ``model.dtype: fastest`` picks on a CPU, so both read the same measurement."""

from __future__ import annotations

import functools

from alignflow.models.call_rate import best_calls_per_second

# a CPU's matrix units can take most of a second to reach full speed: AMX on a 2-core Xeon
# (family 6 model 207) multiplied bf16 at ~760 GFLOP/s for its first 0.6 s of work, then ~1,950,
# and fell back after a pause of 50 ms; a GPU is timed in its steady state within a fraction of it
PROBE_SECONDS = {"cpu": 1.5, "cuda": 0.5}
PROBE_SIZE = {"cpu": 2048, "cuda": 4096}


@functools.cache
def peak_gflops(dtype: str, device: str) -> float:
    """The GEMM rate one device reaches here and now, in GFLOP/s (:func:`measure_gflops` at the
    device's probe size and time). Measured once per process, beside the training it is compared
    with (same machine, same load, same torch settings) rather than taken from a datasheet the
    machine may not reach."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return measure_gflops(dtype, device, PROBE_SIZE[kind], PROBE_SECONDS[kind])


def measure_gflops(dtype: str, device: str, size: int, seconds: float) -> float:
    """The fastest rate square ``size`` matmuls in ``dtype`` (a torch dtype name) reach on
    ``device`` over ``seconds`` of back-to-back products: the ceiling, once the units are warm."""
    import torch

    from alignflow.models.fp32_gemm import fp32_linear

    on = torch.device(device)
    a, b = (torch.randn(size, size, device=on).to(getattr(torch, dtype)) for _ in range(2))
    sync = torch.cuda.synchronize if on.type == "cuda" else (lambda: None)
    repeats = 10 if on.type == "cuda" else 1  # a sync per launch would time the launches
    # fp32 on a CPU: the library the stages' fp32 products use (oneDNN where it is faster)
    multiply = (lambda: fp32_linear(a, b)) if on.type == "cpu" and dtype == "float32" else (lambda: a @ b)
    return 2 * size**3 * best_calls_per_second(multiply, seconds, sync=sync, batch=repeats) / 1e9
