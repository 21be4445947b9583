"""Crash safety: a stage process killed with SIGKILL resumes and matches an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = ["--set", "sft.max_steps=40", "--set", "sft.save_steps=5", "--set", "sft.save_total_limit=null"]
SMALL = [
    "--set",
    "model.hidden_size=64",
    "--set",
    "model.intermediate_size=128",
    "--set",
    "sft.eval_max_rows=32",
]


def sft_command(data_dir: Path, output_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "alignflow.cli", "train", "sft",
        "--config", str(REPO / "configs" / "demo.yaml"),
        "--data", str(data_dir), "--output", str(output_dir), *STEPS, *SMALL,
    ]  # fmt: skip


def run_to_end(data_dir: Path, output_dir: Path) -> None:
    done = subprocess.run(
        sft_command(data_dir, output_dir), capture_output=True, text=True, timeout=600, cwd=output_dir.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]


def kill_after_checkpoint(data_dir: Path, output_dir: Path, step: int) -> None:
    proc = subprocess.Popen(  # its log goes to the working folder's .alignflow/logs: not the checkout's
        sft_command(data_dir, output_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=output_dir.parent,
    )
    target = output_dir / "checkpoints" / f"checkpoint-{step}"
    deadline = time.monotonic() + 600
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the stage finished before it could be killed"
    assert not (output_dir / "result.json").exists()


def test_sigkilled_sft_resumes_to_the_same_model(demo_snapshot, tmp_path):
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    kill_after_checkpoint(demo_snapshot, killed, step=15)
    run_to_end(demo_snapshot, killed)
    run_to_end(demo_snapshot, reference)

    resumed = json.loads((killed / "result.json").read_text())
    straight = json.loads((reference / "result.json").read_text())
    assert resumed["resumed_from"] and int(resumed["resumed_from"].rsplit("-", 1)[1]) >= 15
    assert straight["resumed_from"] is None
    assert resumed["metrics"]["eval/loss"] == pytest.approx(straight["metrics"]["eval/loss"], rel=1e-4)
    a = load_file(killed / "model" / "model.safetensors")
    b = load_file(reference / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
