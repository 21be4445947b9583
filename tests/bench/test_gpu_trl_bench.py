"""The GPU bench's summary: MFU by phase, from the runs' own rates (no GPU needed to check it)."""

from __future__ import annotations

import pytest

from bench import gpu_trl_bench as bench

PARAMETERS = 100_000_000
PEAK_TFLOPS = 500.0


def _run(case: str, side: str, tokens_per_s: float) -> dict:
    return {
        "case": case,
        "side": side,
        "rows_per_s": 10.0,
        "tokens_per_s": tokens_per_s,
        "peak_gpu_gib": 1.0,
        "call_rows_per_s": 5.0,
        "step_s_median": 0.5,
        "warmup_step_s": 1.0,
    }


def _summary(monkeypatch, cases: tuple[str, ...], runs: list[dict]) -> dict:
    monkeypatch.setattr(bench, "CASES", cases)
    return bench.summarise(runs, PARAMETERS, PEAK_TFLOPS)["cases"]


def test_grpo_all_flops_mfu_adds_sampling_to_the_update(monkeypatch):
    cases = _summary(monkeypatch, ("grpo-full",), [_run("grpo-full", "alignflow", 1_000_000.0)])
    figures = cases["grpo-full:alignflow"]
    per_n = PARAMETERS * 1_000_000.0 / (PEAK_TFLOPS * 1e12)
    assert figures["mfu"]["median"] == pytest.approx(6 * per_n)  # the update: forward + both gradients
    assert figures["mfu_all"]["median"] == pytest.approx(8 * per_n)  # and a forward to sample each token


def test_dpo_has_no_sampling_phase_and_adapters_skip_weight_gradients(monkeypatch):
    cases = _summary(
        monkeypatch,
        ("dpo-full", "dpo-lora"),
        [_run("dpo-full", "trl", 2_000_000.0), _run("dpo-lora", "trl", 2_000_000.0)],
    )
    per_n = PARAMETERS * 2_000_000.0 / (PEAK_TFLOPS * 1e12)
    assert cases["dpo-full:trl"]["mfu"]["median"] == pytest.approx(6 * per_n)
    assert cases["dpo-lora:trl"]["mfu"]["median"] == pytest.approx(4 * per_n)
    for name in ("dpo-full:trl", "dpo-lora:trl"):
        assert cases[name]["mfu_all"]["median"] == cases[name]["mfu"]["median"]


def test_without_a_measured_peak_no_mfu_is_made_up(monkeypatch):
    monkeypatch.setattr(bench, "CASES", ("grpo-lora",))
    cases = bench.summarise([_run("grpo-lora", "trl", 1_000_000.0)], PARAMETERS, None)["cases"]
    assert cases["grpo-lora:trl"]["mfu"]["median"] is None
    assert cases["grpo-lora:trl"]["mfu_all"]["median"] is None
