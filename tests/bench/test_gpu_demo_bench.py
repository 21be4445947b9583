"""The GPU bench's arithmetic: which peak a device gets, and tokens/s and MFU from trainer metrics."""

from __future__ import annotations

import pytest

from bench.gpu_demo_bench import peak_tflops, stage_throughput


def test_the_peak_follows_the_exact_h100_variant(monkeypatch):
    monkeypatch.delenv("ALIGNFLOW_PEAK_TFLOPS", raising=False)
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA GeForce GTX 1080") is None
    monkeypatch.setenv("ALIGNFLOW_PEAK_TFLOPS", "100")
    assert peak_tflops("NVIDIA GeForce GTX 1080") == 100.0


def test_mfu_is_achieved_flops_over_the_peak():
    metrics = {"train/runtime": 2.0, "train/num_tokens": 10_000.0, "train/total_flos": 4e14}
    result = stage_throughput(metrics, peak=400.0)
    assert result["tokens_per_s"] == 5000.0
    assert result["achieved_tflops"] == pytest.approx(200.0)
    assert result["mfu"] == pytest.approx(0.5)
    assert stage_throughput(metrics, peak=None)["mfu"] is None
