"""Every ``--help`` reads right at 80 columns: a flag shows no value, a docstring is wrapped
once, no RST markup shows through, no default or name is cut short."""

from __future__ import annotations

import re

import pytest
from typer import _click as click  # typer ships its own click: its groups are that one's
from typer.main import get_command
from typer.testing import CliRunner

from alignflow.cli import app

runner = CliRunner()
CUT_WORD = re.compile(r"\w…")  # a word rich cut short; "validate → … → promote" is prose


def _commands(command: click.core.Command, path: list[str]):
    yield path
    if hasattr(command, "list_commands"):  # a group
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), [*path, name])


COMMANDS = list(_commands(get_command(app), []))


def _help(path: list[str]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "alignflow")
def test_help_shows_flags_bare_no_rst_and_nothing_cut(path):
    shown = _help(path)
    assert "<bool>" not in shown, "a flag reads as taking a value"
    assert "``" not in shown, "RST markup shows through"
    assert not CUT_WORD.search(shown), "a word is cut short:\n" + shown
    assert not re.search(r"--([\w-]+)\s+--no-\1\b", shown), "a flag's negative form doubles its row"


def test_a_docstring_is_wrapped_once():
    shown = _help(["run"])
    assert "rate and ETA" in shown
    assert "quarantined_rows" in _help(["data", "validate"])


def test_run_help_says_the_demo_is_the_default_config():
    assert "default: the built-in demo config" in " ".join(_help(["run"]).replace("│", " ").split())


def test_api_help_shows_its_defaults_whole():
    flat = " ".join(_help(["api"]).replace("│", " ").split())
    for default in (
        "sqlite:///.alignflow/service.db",
        "sqlite:///mlflow.db",
        "default: flow",
    ):
        assert default in flat
