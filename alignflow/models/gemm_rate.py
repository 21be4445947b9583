"""The GEMM rate a device reaches here and now: one probe for the MFU of a stage's cost and
for the dtype ``model.dtype: fastest`` picks on a CPU, so both read the same measurement."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from alignflow.models.call_rate import best_calls_per_second

# a CPU's matrix units can take most of a second to reach full speed: AMX on a 2-core Xeon
# (family 6 model 207) multiplied bf16 at ~760 GFLOP/s for its first 0.6 s of work, then ~1,950,
# and fell back after a pause of 50 ms; a GPU is timed in its steady state within a fraction of it
PROBE_SECONDS = {"cpu": 1.5, "cuda": 0.5}
PROBE_SIZE = {"cpu": 2048, "cuda": 4096}
SMALLEST_CPU_SIZE = 256
# a CPU probe's product gets no larger than a quarter of its time: on an AVX2-only AMD EPYC
# (Zen 3), where torch emulates bf16 at ~0.3 GFLOP/s, one 2048-wide bf16 product took a minute
ROUNDS_AT_LEAST = 4


@functools.cache
def peak_gflops(dtype: str, device: str) -> float:
    """The GEMM rate one device reaches here and now, in GFLOP/s (:func:`measure_gflops` at the
    device's probe size and time). Measured once per process, beside the training it is compared
    with (same machine, same load, same torch settings) rather than taken from a datasheet the
    machine may not reach."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return measure_gflops(dtype, device, PROBE_SIZE[kind], PROBE_SECONDS[kind])


def measure_gflops(dtype: str, device: str, size: int, seconds: float) -> float:
    """The fastest rate square matmuls in ``dtype`` (a torch dtype name) reach on ``device`` over
    ``seconds`` of back-to-back products: the ceiling, once the units are warm. The products are
    ``size`` wide, or narrower on a CPU too slow for ``ROUNDS_AT_LEAST`` of them in ``seconds``."""
    import torch

    on = torch.device(device)
    sync = torch.cuda.synchronize if on.type == "cuda" else (lambda: None)
    repeats = 10 if on.type == "cuda" else 1  # a sync per launch would time the launches
    if on.type == "cpu":
        budget = seconds / ROUNDS_AT_LEAST
        size = fitting_size(lambda n: seconds_per_product(dtype, n), SMALLEST_CPU_SIZE, size, budget)
    multiply = square_product(dtype, device, size)
    return 2 * size**3 * best_calls_per_second(multiply, seconds, sync=sync, batch=repeats) / 1e9


def square_product(dtype: str, device: str, size: int) -> Callable[[], object]:
    """One ``size`` x ``size`` product in ``dtype`` on ``device``, ready to call; fp32 on a CPU
    goes through the library the stages' fp32 products use (oneDNN where it is faster)."""
    import torch

    from alignflow.models.fp32_gemm import fp32_linear

    on = torch.device(device)
    a, b = (torch.randn(size, size, device=on).to(getattr(torch, dtype)) for _ in range(2))
    if on.type == "cpu" and dtype == "float32":
        return lambda: fp32_linear(a, b)
    return lambda: a @ b


def seconds_per_product(dtype: str, size: int) -> float:
    """How long one warm ``size``-wide CPU product in ``dtype`` takes."""
    multiply = square_product(dtype, "cpu", size)
    multiply()
    started = time.perf_counter()
    multiply()
    return time.perf_counter() - started


def fitting_size(seconds_at: Callable[[int], float], smallest: int, largest: int, budget: float) -> int:
    """The widest power-of-two product from ``smallest`` up to ``largest`` whose time, read off
    the narrower one's (a product twice as wide takes 8x as long), stays within ``budget``."""
    size = min(smallest, largest)
    while size * 2 <= largest and 8 * seconds_at(size) <= budget:
        size *= 2
    return size
