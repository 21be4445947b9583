"""Prefect's flow runs stay in the workspace, as MLflow's runs do (issue #48, defect 11).

A second checkout's Prefect UI must not list the first one's runs under the same names:
the CLI puts Prefect's home (its database, its files) in the workspace's ``.alignflow/``,
unless the user chose a home or a server themselves.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.flows.environment import PREFECT_STATE, prefect_ui_command, workspace_prefect_home

REPO = Path(__file__).resolve().parents[2]

# the CLI with one more command: Prefect imported by a command, as every real one does
PROBE = """
from alignflow.cli import app


@app.command("probe-prefect")
def probe(run_flow: bool = False) -> None:
    from prefect import flow
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    print(f"home={settings.home}")
    print(f"api={settings.api.url}")
    if run_flow:
        flow(name="probe")(lambda: 1)()


app()
"""


def _run_probe(tmp_path: Path, workspace: Path, *args: str, **extra: str) -> dict[str, str]:
    """``probe-prefect`` in ``workspace`` with a fresh home directory; what it printed."""
    (tmp_path / "probe_cli.py").write_text(PROBE, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env.update(
        HOME=str(tmp_path / "user-home"),
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",  # as the CLI's run: a loaded machine
        **extra,
    )
    workspace.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "probe_cli.py"), "probe-prefect", *args],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def _flow_runs(database: Path) -> int:
    with sqlite3.connect(database) as db:
        return db.execute("select count(*) from flow_run").fetchone()[0]


def test_the_home_is_the_workspaces_unless_the_user_chose_one(tmp_path):
    assert workspace_prefect_home(tmp_path, {}) == tmp_path.resolve() / ".alignflow" / "prefect"
    assert workspace_prefect_home(tmp_path, {"PREFECT_HOME": "/theirs"}) is None
    assert workspace_prefect_home(tmp_path, {"PREFECT_API_URL": "http://host:4200/api"}) is None


def test_git_ignores_the_workspaces_prefect_state():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(PREFECT_STATE / "prefect.db")], cwd=REPO, check=False
    )
    assert ignored.returncode == 0


def test_the_ui_command_names_the_home_the_runs_went_to(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / PREFECT_STATE))
    command = prefect_ui_command(tmp_path)
    assert command.startswith(f"PREFECT_HOME={PREFECT_STATE} prefect server start")
    monkeypatch.setenv("PREFECT_API_URL", "http://host:4200/api")
    assert prefect_ui_command(tmp_path).startswith("browse http://host:4200 ")


@pytest.mark.slow
def test_two_workspaces_keep_their_own_flow_runs_out_of_the_users_home(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for workspace in (first, second):
        shown = _run_probe(tmp_path, workspace, "--run-flow")
        assert Path(shown["home"]) == workspace.resolve() / PREFECT_STATE
    for workspace in (first, second):
        assert _flow_runs(workspace / PREFECT_STATE / "prefect.db") == 1  # its own run, not the other's
    assert not (tmp_path / "user-home" / ".prefect" / "prefect.db").exists()


def test_a_prefect_home_the_user_set_is_kept(tmp_path):
    theirs = tmp_path / "their-prefect"
    shown = _run_probe(tmp_path, tmp_path / "work", PREFECT_HOME=str(theirs))
    assert Path(shown["home"]) == theirs


def test_a_server_the_user_set_is_used_with_no_workspace_home(tmp_path):
    shown = _run_probe(tmp_path, tmp_path / "work", PREFECT_API_URL="http://127.0.0.1:9/api")
    assert shown["api"] == "http://127.0.0.1:9/api"
    assert Path(shown["home"]) == tmp_path / "user-home" / ".prefect"
    assert not (tmp_path / "work" / PREFECT_STATE).exists()
