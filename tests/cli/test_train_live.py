"""``alignflow train sft`` on a terminal: the live view of its steps, and the result on stdout."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.cli.terminal import cli, noise_in, run_in_terminal, screen_lines

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 40
SMALL = [
    f"sft.max_steps={STEPS}",
    "sft.save_steps=1000",
    "sft.eval_max_rows=16",
    "model.hidden_size=64",
    "model.intermediate_size=128",
]


@pytest.fixture
def snapshot(tmp_path, demo_records) -> Path:
    from alignflow.data.snapshot import write_split

    rows = [dict(r, kind="pair") for r in demo_records[:300]]
    write_split(tmp_path / "data", "train", rows[:260])
    write_split(tmp_path / "data", "eval", rows[260:])
    return tmp_path / "data"


def test_train_on_a_terminal_draws_the_stage_with_its_steps_and_keeps_library_noise_off(snapshot, tmp_path):
    sets = [arg for item in SMALL for arg in ("--set", item)]
    command = cli("train", "sft", "--config", str(REPO / "configs" / "demo.yaml"), "--data", str(snapshot))
    command += ["--output", str(tmp_path / "out"), *sets]
    # the user's environment asks the libraries for their warnings and bars
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "warning", "HF_HUB_DISABLE_PROGRESS_BARS": "0"}
    code, raw = run_in_terminal(command, tmp_path, env)
    assert code == 0, raw[-3000:]
    lines = screen_lines(raw)
    assert any("alignflow train sft" in line for line in lines), "the heading"
    shown = {int(n) for line in lines if " sft " in line for n in re.findall(rf"step (\d+)/{STEPS}", line)}
    assert any(0 < n < STEPS for n in shown), f"steps while training: {sorted(shown)}"
    assert noise_in(raw) == []
    result = json.loads(raw[raw.index("{\r\n") :].replace("\r\n", "\n"))
    assert result["stage"] == "sft" and Path(result["model_dir"]).is_dir()
    assert Path(result["log"]).parent == tmp_path / ".alignflow" / "logs"
