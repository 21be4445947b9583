"""The GEMM peak: square products on the device, timed until the units are warm."""

from __future__ import annotations

import pytest

from alignflow.models import gemm_rate


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_measured_peak_is_a_plausible_rate(dtype):
    rate = gemm_rate.measure_gflops(dtype, "cpu", size=256, seconds=0.05)
    assert 0.1 < rate < 1e6, rate


def cubic(seconds_at_256: float):
    """A fake CPU whose 256-wide product takes ``seconds_at_256``, wider ones by n^3."""
    return lambda n: seconds_at_256 * (n / 256) ** 3


def test_the_probe_grows_while_the_next_product_fits_its_budget():
    assert gemm_rate.fitting_size(cubic(1e-3), 256, 2048, budget=0.375) == 1024  # 2048 would take 0.51 s
    assert gemm_rate.fitting_size(cubic(1e-5), 256, 2048, budget=0.375) == 2048, "never wider than asked"
    assert gemm_rate.fitting_size(cubic(0.1), 256, 2048, budget=0.4) == 256, "no narrower than the smallest"
    assert gemm_rate.fitting_size(cubic(1e-5), 256, 128, budget=0.375) == 128, "a smaller ask is kept"


@pytest.mark.parametrize(("seconds_at_256", "size"), [(0.12, 256), (1e-7, 2048)])
def test_a_cpu_too_slow_for_the_wide_probe_is_timed_on_narrower_products(monkeypatch, seconds_at_256, size):
    """Emulated bf16 on an AVX2-only CPU took a minute a 2048-wide product: the probe narrows
    its products until several fit in its time, and keeps the wide one where they are fast."""
    monkeypatch.setattr(gemm_rate, "seconds_per_product", lambda dtype, n: cubic(seconds_at_256)(n))
    timed = []
    real = gemm_rate.square_product
    monkeypatch.setattr(gemm_rate, "square_product", lambda d, dev, n: timed.append(n) or real(d, dev, 64))
    gemm_rate.measure_gflops("float32", "cpu", size=2048, seconds=0.02)
    assert timed == [size]
