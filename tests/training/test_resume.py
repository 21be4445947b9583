"""Crash safety: a stage process killed with SIGKILL resumes and ends with the very weights of an
uninterrupted run (bit for bit: on a CPU each stage's deterministic mode is on by default)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.hidden_size=64", "model.intermediate_size=128"]

# per stage: its steps and checkpoint interval, and the checkpoint after which it is killed; every
# stage trains from the base model here, so each runs on its own
STAGES = {
    "sft": ({"max_steps": 40, "save_steps": 5}, 15),
    # 40 steps an epoch on the demo snapshot: these two resume in their second epoch, whose order
    # the resumed run must draw as the uninterrupted one did (the chaos bench found it did not)
    "reward": ({"max_steps": 60, "save_steps": 10}, 50),
    "dpo": ({"max_steps": 60, "save_steps": 10}, 50),
    "grpo": ({"max_steps": 12, "save_steps": 3, "eval_max_rows": 16}, 6),
    "ppo": (
        {
            "reward_model": "null", "verifiable_rewards": "[correctness,format]", "num_iterations": 12,
            "save_every": 3, "batch_size": 16, "mini_batch_size": 8, "eval_max_rows": 16,
        },
        6,
    ),
}  # fmt: skip
KEEP_EVERY_CHECKPOINT = {"save_total_limit": "null", "eval_max_rows": 32}


def stage_overrides(stage: str) -> list[str]:
    """``--set`` values for ``stage``: every checkpoint kept (PPO keeps them all anyway)."""
    fields = STAGES[stage][0] if stage == "ppo" else {**KEEP_EVERY_CHECKPOINT, **STAGES[stage][0]}
    return [f"{stage}.{key}={value}" for key, value in fields.items()]


def stage_command(stage: str, data_dir: Path, output_dir: Path) -> list[str]:
    overrides = [arg for value in [*stage_overrides(stage), *SMALL] for arg in ("--set", value)]
    return [
        sys.executable, "-m", "alignflow.cli", "train", stage, "--quiet",
        "--config", str(REPO / "configs" / "demo.yaml"),
        "--data", str(data_dir), "--output", str(output_dir), *overrides,
    ]  # fmt: skip


def run_to_end(stage: str, data_dir: Path, output_dir: Path) -> dict:
    done = subprocess.run(
        stage_command(stage, data_dir, output_dir),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=output_dir.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((output_dir / "result.json").read_text())


def kill_after_checkpoint(stage: str, data_dir: Path, output_dir: Path, step: int) -> None:
    proc = subprocess.Popen(  # its log goes to the working folder's .alignflow/logs: not the checkout's
        stage_command(stage, data_dir, output_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=output_dir.parent,
    )
    target = output_dir / "checkpoints" / f"checkpoint-{step}"
    deadline = time.monotonic() + 600
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the stage finished before it could be killed"
    assert not (output_dir / "result.json").exists()


def weights(output_dir: Path) -> dict:
    files = sorted((output_dir / "model").glob("*.safetensors"))
    assert files, f"no safetensors under {output_dir / 'model'}"
    return {f"{f.name}:{name}": t for f in files for name, t in load_file(f).items()}


@pytest.mark.parametrize("stage", list(STAGES))
def test_sigkilled_stage_resumes_to_the_same_weights(stage, demo_snapshot, tmp_path):
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    step = STAGES[stage][1]
    kill_after_checkpoint(stage, demo_snapshot, killed, step)
    resumed = run_to_end(stage, demo_snapshot, killed)
    reference = run_to_end(stage, demo_snapshot, straight)

    assert resumed["resumed_from"] and int(resumed["resumed_from"].rsplit("-", 1)[1]) >= step
    assert reference["resumed_from"] is None
    # the resumed run did the remaining steps, not none and not all of them again
    assert resumed["metrics"]["global_step"] == reference["metrics"]["global_step"]
    a, b = weights(killed), weights(straight)
    assert a.keys() == b.keys()
    different = [name for name in a if not a[name].equal(b[name])]
    assert not different, f"{stage}: resumed weights differ from the uninterrupted run's in {different[:5]}"
