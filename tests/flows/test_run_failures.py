"""``alignflow run`` stopped by its input: the cause in a few lines, the traceback in the log.

Before, a data file with one unbalanced quote printed some 400 lines of traceback through
Prefect's engine above the line that named the file and row.
"""

from __future__ import annotations

import re

from typer.testing import CliRunner

from alignflow.cli import app


def test_bad_data_stops_the_run_with_its_file_and_row_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pairs.csv").write_text('prompt,chosen,rejected\nWhy?,"Because,No\n', encoding="utf-8")
    args = ["run", "--set", "data.source=pairs.csv", "--set", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) < 25, result.output
    assert "error: validation FAILED" in result.output
    assert "pairs.csv:1: the record starting at line 2 is not valid CSV" in result.output
    logs = list((tmp_path / ".alignflow" / "logs").glob("run-*.log"))
    assert len(logs) == 1 and f"log (with the traceback): {logs[0]}" in result.output
    assert "Traceback (most recent call last)" in logs[0].read_text()
    assert "DataValidationFailed" in logs[0].read_text()


def test_data_a_training_stage_cannot_use_stops_the_run_in_one_line(tmp_path, monkeypatch):
    """Prompt-only rows pass validation, but the SFT stage needs pairs: it says so, no traceback."""
    import json

    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"What is {i} plus 1?", "answer": str(i + 1)} for i in range(40)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tracking = f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"
    result = CliRunner().invoke(app, ["run", "--set", "data.source=prompts.jsonl", "--set", tracking])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    assert "sft: failed" in result.output
    assert re.search(
        r"error: .*train\.parquet: no pair/scored/ranked rows for this stage \(it holds \d+ prompt\)",
        result.output,
    )
