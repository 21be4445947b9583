"""A ``models:/`` name that is not registered says which names are (eval, promote, rollback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.registry import models
from alignflow.registry.evaluations import resolve_model
from alignflow.registry.names import UnknownModelError, registered_model_names, require_registered

REGISTERED = "alignflow-demo-reward"


@pytest.fixture
def uri(tmp_path) -> str:
    """A real SQLite store holding one registered model, version 1 (the challenger)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "model").mkdir()
    models.register(store, str(tmp_path / "model"), REGISTERED)
    return store


def test_an_unknown_name_lists_the_registered_ones_and_the_closest(uri, tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        resolve_model("models:/alignflow-reward@champion", uri, tmp_path / "work")
    message = str(caught.value)
    assert "no registered model 'alignflow-reward'" in message
    assert f"did you mean '{REGISTERED}'?" in message
    assert f"registered models: {REGISTERED}" in message


def test_a_version_number_of_an_unknown_name_is_reported_the_same_way(uri, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"registered models: {REGISTERED}"):
        resolve_model("models:/zzz/1", uri, tmp_path / "work")


def test_a_missing_alias_of_a_known_name_lists_its_aliases(uri, tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        resolve_model(f"models:/{REGISTERED}@champion", uri, tmp_path / "work")
    assert "has no alias @champion" in str(caught.value)
    assert "@challenger (version 1)" in str(caught.value)


def test_an_empty_registry_says_so(tmp_path):
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert registered_model_names(empty) == []
    with pytest.raises(UnknownModelError, match="the registry is empty"):
        require_registered(empty, "alignflow-demo-policy")


def test_eval_exits_2_with_the_names(uri, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n', encoding="utf-8")
    ref = "models:/alignflow-reward@champion"
    result = CliRunner().invoke(
        app, ["eval", "reward", "--model", ref, "--data", str(data), "--tracking-uri", uri]
    )
    assert result.exit_code == 2, result.output
    assert REGISTERED in result.output


@pytest.mark.parametrize("command", [["promote", "--dry-run"], ["rollback"]])
def test_promote_and_rollback_exit_2_with_the_names(uri, command):
    result = CliRunner().invoke(app, [*command, "--tracking-uri", uri, "--set", "project=alignflow"])
    assert result.exit_code == 2, result.output
    assert "no registered model 'alignflow-policy'" in result.output
    assert f"registered models: {REGISTERED}" in result.output
