"""Which dtype multiplies matrices faster on this CPU: measured, not read off its flags.

A CPU flag says bf16 instructions exist, not that torch's kernels make them pay. Two
machines of one kind, both with AVX512-BF16 and no AMX, showed it: on an AMD EPYC (Zen 4)
bf16 products ran well ahead of fp32, while on an Intel Xeon (family 6 model 207) a bf16
1024x1024 GEMM ran at ~165 GFLOP/s against fp32's ~315, so "fastest" meant fp32 there and bf16
generation and training ran at half speed. :func:`fastest_cpu_dtype` times both once per
process and picks bf16 only when it is clearly ahead.
"""

from __future__ import annotations

import torch

from alignflow.models.gemm_rate import peak_gflops

BF16_MARGIN = 1.2  # bf16 must beat fp32 by this much: a near tie keeps fp32's precision


def cpu_bf16_units() -> list[str]:
    """The bf16 matrix units this CPU has (AMX, AVX512-BF16); without any, torch emulates bf16
    matrix products (measured on an AVX2-only AMD EPYC: 1 GFLOP/s against fp32's 63)."""
    probes = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
    return [name for name, probe in probes if getattr(torch.cpu, probe, lambda: False)()]


def cpu_gemm_rates() -> dict[str, float]:
    """bf16 and fp32 GEMM GFLOP/s on this CPU, each probed once per process
    (:func:`~alignflow.models.gemm_rate.peak_gflops`, the peak a stage's MFU is priced against)."""
    return {dtype: peak_gflops(dtype, "cpu") for dtype in ("bfloat16", "float32")}


def fastest_cpu_dtype() -> torch.dtype:
    """bf16 where this CPU has bf16 units and its bf16 GEMM beats fp32's by
    :data:`BF16_MARGIN`, else fp32 (a CPU without the units is not timed: emulated bf16 is
    always far behind)."""
    if not cpu_bf16_units():
        return torch.float32
    rates = cpu_gemm_rates()
    return torch.bfloat16 if rates["bfloat16"] >= BF16_MARGIN * rates["float32"] else torch.float32
