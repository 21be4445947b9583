"""The demo config on a CUDA GPU in bf16: training tokens/s and model FLOPs utilisation per stage.

Runs ``alignflow run --config configs/demo.yaml`` with ``model.dtype=bfloat16`` in a scratch
workspace, then reads each training stage's MLflow run: ``train/num_tokens``,
``train/runtime`` and ``train/total_flos`` (transformers' 6 x parameters x tokens
estimate, so reference-model forwards in DPO and attention are not counted: the MFU is
a lower bound). MFU = achieved FLOP/s / the device's dense bf16 peak.

Run on a GPU machine: ``python -m bench gpu_demo``. Without CUDA it is skipped (no result
file is written), unless ``ALIGNFLOW_BENCH_ALLOW_CPU=1`` asks for a dry run of the same
measurement on the CPU (tokens/s only; a CPU has no peak in the table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINING_STAGES = ("sft", "reward", "policy")

# dense bf16 tensor-core peaks from the vendors' datasheets, in TFLOP/s; first match wins
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),
    ("H200", 989.4),
    ("A100", 312.0),
)


def peak_tflops(device_name: str) -> float | None:
    """The device's dense bf16 peak; ``ALIGNFLOW_PEAK_TFLOPS`` overrides the table."""
    if os.environ.get("ALIGNFLOW_PEAK_TFLOPS"):
        return float(os.environ["ALIGNFLOW_PEAK_TFLOPS"])
    return next((peak for name, peak in PEAK_BF16_TFLOPS if name in device_name), None)


def stage_throughput(metrics: dict[str, float], peak: float | None) -> dict[str, float | None]:
    """tokens/s, achieved TFLOP/s and MFU from one stage run's trainer metrics."""
    runtime = metrics["train/runtime"]
    tflops = metrics["train/total_flos"] / runtime / 1e12
    return {
        "train_tokens": metrics["train/num_tokens"],
        "train_runtime_s": round(runtime, 3),
        "tokens_per_s": round(metrics["train/num_tokens"] / runtime, 1),
        "achieved_tflops": round(tflops, 4),
        "mfu": round(tflops / peak, 6) if peak else None,
    }


def _device() -> tuple[str, bool]:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), torch.cuda.is_bf16_supported()
    return "cpu", False


def _run_demo(workspace: Path, uri: str) -> dict:
    command = [sys.executable, "-m", "alignflow.cli", "run", "--config", str(REPO / "configs" / "demo.yaml")]
    command += ["--set", "model.dtype=bfloat16", "--set", f"tracking.uri={uri}"]
    command += ["--summary-json", str(workspace / "summary.json")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(command, cwd=workspace, check=True, stdout=subprocess.DEVNULL, env=env)
    return json.loads((workspace / "summary.json").read_text())


def run() -> dict:
    device, bf16 = _device()
    if device == "cpu" and os.environ.get("ALIGNFLOW_BENCH_ALLOW_CPU") != "1":
        return {"name": "gpu_demo", "skipped": "no CUDA device (ALIGNFLOW_BENCH_ALLOW_CPU=1 for a dry run)"}
    from alignflow.registry.runs import child_runs

    peak = peak_tflops(device)
    with tempfile.TemporaryDirectory(prefix="alignflow-gpu-") as tmp:
        workspace = Path(tmp)
        uri = f"sqlite:///{workspace / 'mlflow.db'}"
        started = time.perf_counter()
        summary = _run_demo(workspace, uri)
        command_s = time.perf_counter() - started
        runs = {r.info.run_name: r for r in child_runs(uri, summary["parent_run_id"])}
    stages = {name: stage_throughput(runs[name].data.metrics, peak) for name in TRAINING_STAGES}
    tokens = sum(s["train_tokens"] for s in stages.values())
    seconds = sum(s["train_runtime_s"] for s in stages.values())
    return {
        "name": "gpu_demo",
        "device": device,
        "bf16": bf16,
        "peak_bf16_tflops": peak,
        "command_s": round(command_s, 2),
        "flow_wall_s": round(summary["wall_seconds"], 2),
        "train_tokens_per_s": round(tokens / seconds, 1),
        "mfu_best_stage": max((s["mfu"] or 0.0) for s in stages.values()) if peak else None,
        "promoted": sorted(role for role, d in summary["promotions"].items() if d["promoted"]),
        "stages": stages,
    }
