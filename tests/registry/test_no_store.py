"""A read-only registry command in a folder with no tracking store says so, and leaves none behind.

MLflow creates an empty ``mlflow.db`` (or ``mlruns/``) on first use of a local URI: ``promote``
there used to make one just to report an empty registry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app

PAIR = {"prompt": "What is 1 plus 1?", "chosen": "2", "rejected": "3"}


@pytest.fixture
def empty(tmp_path: Path, monkeypatch) -> Path:
    """An empty working folder, no tracking URI in the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("command", "uri"),
    [
        (["promote"], "sqlite:///mlflow.db"),
        (["promote", "--dry-run"], "sqlite:///mlflow.db"),
        (["promote", "--force", "--version", "1"], "sqlite:///mlflow.db"),
        (["rollback"], "sqlite:///mlflow.db"),
        (["promote", "--dry-run", "--tracking-uri", "mlruns"], "mlruns"),
        (["promote", "--dry-run", "--tracking-uri", "file:./mlruns"], "file:./mlruns"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_no_store_is_one_line_naming_it_and_creates_none(empty, command, uri):
    result = CliRunner().invoke(app, command)
    _assert_no_store_answer(result, empty, uri)


def test_eval_of_a_registered_model_without_a_store_creates_none(empty):
    data = empty / "data" / "pairs.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps(PAIR) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["eval", "reward", "--model", "models:/m@champion", "--data", str(data)])
    _assert_no_store_answer(result, empty, "sqlite:///mlflow.db")


def _assert_no_store_answer(result, folder: Path, uri: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    answers = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(answers) == 1, result.output
    assert f"no MLflow tracking store at {uri}" in answers[0], answers[0]
    assert "`alignflow run` here makes one" in answers[0] and "--tracking-uri" in answers[0]
    assert not (folder / "mlflow.db").exists() and not (folder / "mlruns").exists()
