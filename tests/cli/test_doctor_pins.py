"""``alignflow doctor`` names a committed DVC pointer that the first run could not restore."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from alignflow.cli import app

REPO = Path(__file__).resolve().parents[2]


def test_doctor_fails_on_a_pin_nothing_can_restore_and_says_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # another test in this worker may have set it
    for name in ("data.dvc", "golden.dvc"):
        shutil.copyfile(REPO / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    demo = str(REPO / "configs" / "demo.yaml")
    ok = CliRunner().invoke(app, ["doctor", "--config", demo])
    assert ok.exit_code == 0, ok.output
    assert "Pin golden.dvc" in ok.output and "rebuilt from the built-in" in ok.output

    golden = tmp_path / "golden.dvc"
    golden.write_text(golden.read_text().replace("md5: ", "md5: 1"), encoding="utf-8")
    lost = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["doctor", "--config", demo])
    assert lost.exit_code == 1, lost.output
    row = next(line for line in lost.output.splitlines() if "Pin golden.dvc" in line)
    assert "missing" in row and "make pins" in row
