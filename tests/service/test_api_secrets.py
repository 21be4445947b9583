"""``alignflow api`` takes its bearer tokens from the environment or a file, never needing them on
the command line (where ``ps -ef`` shows them to every user), and keeps its database in the
workspace's git-ignored state folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.service.settings import ServiceSettings

REPO = Path(__file__).resolve().parents[2]
TOKEN = "env-token-0123456789abcdef"


def _tokens(served: dict) -> list[str]:
    return [t.token.get_secret_value() for t in served["app"].state.settings.tokens]


def test_the_token_comes_from_the_environment(served, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_API_TOKEN", TOKEN)
    result = CliRunner().invoke(app, ["api", "--launcher", "library"])
    assert result.exit_code == 0, result.output
    assert _tokens(served) == [TOKEN]
    assert "generated token" not in result.output


def test_the_tokens_come_from_a_file(served, tmp_path: Path):
    path = tmp_path / "tokens"
    path.write_text(f"# one per line\n{TOKEN}\n{TOKEN[::-1]}:agent_a,agent_b\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["api", "--launcher", "library", "--token-file", str(path)])
    assert result.exit_code == 0, result.output
    assert _tokens(served) == [TOKEN, TOKEN[::-1]]
    assert served["app"].state.settings.tokens[1].agents == ["agent_a", "agent_b"]


@pytest.mark.parametrize(
    ("content", "said"),
    [("short\n", "line 1: a bearer token needs at least 16 characters"), ("# nothing\n", "holds no token")],
)
def test_a_bad_token_file_is_one_line_naming_it(served, tmp_path: Path, content: str, said: str):
    path = tmp_path / "tokens"
    path.write_text(content, encoding="utf-8")
    result = CliRunner().invoke(app, ["api", "--launcher", "library", "--token-file", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: --token-file {path}: {said}"), result.output
    assert result.output.count("\n") == 1, result.output
    assert "short" not in result.output.replace(said, ""), "the token itself is never echoed"
    assert "app" not in served


def test_a_bad_token_in_the_environment_names_the_variable(served, monkeypatch):
    monkeypatch.setenv("ALIGNFLOW_API_TOKEN", "short")
    result = CliRunner().invoke(app, ["api", "--launcher", "library"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ALIGNFLOW_API_TOKEN: a bearer token needs at least 16")
    assert "Traceback" not in result.output and "app" not in served


def test_the_readme_never_puts_a_token_on_the_command_line():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "--token " not in readme.replace("--token-file", "")
    assert "alignflow api --token-file" in readme


def test_the_service_database_lives_in_the_ignored_state_folder():
    database = ServiceSettings().database_url.removeprefix("sqlite:///")
    assert Path(database).parts[0] == ".alignflow"
    ignored = subprocess.run(["git", "check-ignore", "-q", database], cwd=REPO, check=False)
    assert ignored.returncode == 0, f"{database} is not git-ignored"
