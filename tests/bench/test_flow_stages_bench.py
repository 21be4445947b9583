"""The flow-stages bench keeps one run per kind of machine and puts them side by side."""

from __future__ import annotations

from bench.flow_stages_bench import markdown, merged, stage_rows

SUMMARY = {
    "stages": [
        {"name": "data", "seconds": 3.0, "cached": False, "cost": {"cost/cpu_seconds": 3.0}},
        {"name": "sft", "seconds": 140.0, "cached": False,
         "cost": {"cost/cpu_seconds": 266.0, "cost/gpu_seconds": 0.0, "cost/mfu": 0.204,
                  "cost/tokens_trained": 9.0}},
        {"name": "evaluate", "seconds": 85.0, "cached": False, "cost": {"cost/cpu_seconds": 165.0}},
    ]
}  # fmt: skip


def machine(name: str, scale: float) -> dict:
    stages = stage_rows(SUMMARY, {"sft": name, "evaluate": name})
    # sorted by name, as `python -m bench` writes the result file
    stages = {stage: row | {"wall_s": row["wall_s"] / scale} for stage, row in sorted(stages.items())}
    return {
        "machine": name, "cpus": 2, "torch": "2.13.0", "config": "configs/smollm2-math.yaml",
        "overrides": ["model.weights=random"], "commit": "abc1234", "date": "2026-12-05",
        "flow_wall_s": 240.0 / scale, "stages": stages,
    }  # fmt: skip


def test_each_stage_keeps_its_wall_time_cost_and_recorded_device():
    rows = stage_rows(SUMMARY, {"sft": "NVIDIA H200", "evaluate": "NVIDIA H200"})
    assert rows["sft"] == {
        "wall_s": 140.0, "cached": False, "cpu_s": 266.0, "gpu_s": 0.0, "tokens": 9.0, "mfu": 0.204,
        "device": "NVIDIA H200",
    }  # fmt: skip
    assert rows["data"]["device"] is None, "a stage that ran no model records no device"


def test_a_machines_new_run_replaces_its_last_and_keeps_the_others():
    cpu, gpu = machine("CPU: AMD EPYC", 1.0), machine("GPU: NVIDIA H200", 10.0)
    result = merged(merged({}, cpu), gpu)
    assert list(result["runs"]) == ["CPU: AMD EPYC", "GPU: NVIDIA H200"] and result["machines"] == 2
    again = merged(result, machine("CPU: AMD EPYC", 2.0))
    assert again["runs"]["CPU: AMD EPYC"]["flow_wall_s"] == 120.0 and again["runs"]["GPU: NVIDIA H200"] == gpu


def test_the_report_puts_the_machines_side_by_side_with_the_speed_up():
    text = markdown(merged(merged({}, machine("CPU: AMD EPYC", 1.0)), machine("GPU: NVIDIA H200", 10.0)))
    assert "| stage | CPU: AMD EPYC | GPU: NVIDIA H200 |" in text
    assert "| sft | 140.0 s, MFU 20.4% | 14.0 s, MFU 20.4% |" in text
    assert "- GPU: NVIDIA H200: data 10.0x, sft 10.0x, evaluate 10.0x; whole flow 10.0x" in text, text
    assert text.index("| data |") < text.index("| sft |") < text.index("| evaluate |"), "the flow's order"
    alone = markdown(merged({}, machine("CPU: AMD EPYC", 1.0)))
    assert "Speed-up" not in alone and "| evaluate | 85.0 s |" in alone
