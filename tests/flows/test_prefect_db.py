"""A new workspace's Prefect home gets a migrated database; one that has a database keeps it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.flows import prefect_db
from alignflow.flows.environment import PREFECT_STATE
from alignflow.flows.prefect_db import DATABASE, seed_prefect_home, seed_workspace_home, template_path

A_FLOW_ON_THE_EPHEMERAL_API = """
from prefect import flow, get_client

@flow
def one() -> int:
    return 1

assert one() == 1
with get_client(sync_client=True) as client:
    print("flow runs:", client.count_flow_runs())
"""


@pytest.fixture
def clean_environ(tmp_path, monkeypatch) -> dict[str, str]:
    """No database chosen by the user. alignflow's cache stays the session's (tests/conftest.py):
    the template built here serves this worker's later workspaces too."""
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(tmp_path / "no-profiles.toml"))
    for name in prefect_db.USER_DATABASE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return dict(os.environ)


def alembic_head(database: Path) -> str:
    with sqlite3.connect(database) as connection:
        return connection.execute("select version_num from alembic_version").fetchone()[0]


@pytest.mark.slow
def test_a_new_home_gets_the_migrated_database_and_prefect_runs_flows_on_it(tmp_path, clean_environ):
    home = tmp_path / "home"
    home.mkdir()
    assert seed_prefect_home(home, clean_environ)
    assert [p.name for p in home.iterdir()] == [DATABASE], "no partial copy left behind"
    assert template_path().exists() and alembic_head(home / DATABASE) == alembic_head(template_path())
    env = {k: v for k, v in clean_environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    command = [sys.executable, "-c", A_FLOW_ON_THE_EPHEMERAL_API]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "flow runs: 1" in done.stdout, "the run went to the seeded database"
    second = tmp_path / "second"
    second.mkdir()
    assert seed_prefect_home(second, clean_environ), "the next home is copied from the same template"


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache of the test's own: no template built by an earlier test."""
    monkeypatch.setenv("ALIGNFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_home_with_a_database_keeps_it(tmp_path, clean_environ, monkeypatch):
    monkeypatch.setattr(prefect_db, "build_template", lambda target: pytest.fail("nothing to build"))
    (tmp_path / DATABASE).write_bytes(b"the user's flow runs")
    assert not seed_prefect_home(tmp_path, clean_environ)
    assert (tmp_path / DATABASE).read_bytes() == b"the user's flow runs"


@pytest.mark.parametrize("where", ["environment", "profile"])
def test_a_database_the_user_chose_is_left_to_prefect(tmp_path, clean_environ, where):
    if where == "environment":
        clean_environ["PREFECT_API_DATABASE_CONNECTION_URL"] = "postgresql+asyncpg://127.0.0.1/prefect"
    else:
        profiles = Path(clean_environ["PREFECT_PROFILES_PATH"])
        profiles.write_text(
            '[profiles.local]\nPREFECT_API_DATABASE_CONNECTION_URL = "postgresql+asyncpg://db/prefect"\n',
            encoding="utf-8",
        )
    assert not seed_prefect_home(tmp_path, clean_environ)
    assert not (tmp_path / DATABASE).exists()


def test_a_template_that_cannot_be_built_leaves_the_database_to_prefect(
    tmp_path, own_cache, clean_environ, monkeypatch
):
    def failing(target: Path) -> Path:
        raise subprocess.CalledProcessError(1, "migrate")

    monkeypatch.setattr(prefect_db, "build_template", failing)
    home = tmp_path / "home"
    home.mkdir()
    assert not seed_prefect_home(home, clean_environ)
    assert list(home.iterdir()) == [], "no database, no partial copy: Prefect migrates its own"


@pytest.mark.parametrize(
    ("setting", "seeded"),
    [("the workspace's home", True), ("a home of the user's", False), ("a Prefect server", False)],
)
def test_only_the_workspaces_own_home_on_the_ephemeral_api_is_seeded(
    tmp_path, own_cache, clean_environ, monkeypatch, setting, seeded
):
    def fake_template(target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"migrated")
        return target

    monkeypatch.setattr(prefect_db, "build_template", fake_template)
    home = tmp_path / PREFECT_STATE
    home.mkdir(parents=True)
    clean_environ.pop("PREFECT_API_URL", None)
    clean_environ["PREFECT_HOME"] = (
        str(tmp_path / "elsewhere") if setting == "a home of the user's" else str(home)
    )
    if setting == "a Prefect server":
        clean_environ["PREFECT_API_URL"] = "http://127.0.0.1:4200/api"
    assert seed_workspace_home(tmp_path, clean_environ) is seeded
    assert (home / DATABASE).exists() is seeded
