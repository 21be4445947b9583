"""The GEMM peak: square products on the device, timed until the units are warm."""

from __future__ import annotations

import pytest

from alignflow.models import gemm_rate


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_measured_peak_is_a_plausible_rate(dtype):
    rate = gemm_rate.measure_gflops(dtype, "cpu", size=256, seconds=0.05)
    assert 0.1 < rate < 1e6, rate
