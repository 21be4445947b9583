"""A new workspace's Prefect database, copied from an empty migrated one instead of migrated anew.

Prefect's ephemeral API migrates a new ``prefect.db`` from scratch when it first starts in a
Prefect home: ~14 s of a ~20 s start on 2 cores, paid by every new workspace (``make demo``'s
first run, each test workspace). The migrated, empty database is the same for every
workspace on one Prefect version, so it is built once per version under alignflow's cache
(:func:`alignflow.cache.cache_home`) and copied into each new home; Prefect then finds its
schema current and starts in ~6 s. A home that has a database, or a database the user
configured elsewhere (``PREFECT_API_DATABASE_CONNECTION_URL``, e.g. PostgreSQL), is left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

from alignflow.cache import cache_home
from alignflow.flows.environment import PREFECT_STATE

DATABASE = "prefect.db"
USER_DATABASE_SETTINGS = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")
# run in a process of its own: Prefect keeps its database settings and engines per process
MIGRATE = (
    "import asyncio\n"
    "from prefect.server.database import provide_database_interface\n"
    "asyncio.run(provide_database_interface().create_db())\n"
)


def template_path() -> Path:
    """Where the empty migrated database of the installed Prefect version is kept."""
    return cache_home() / "prefect-db" / f"prefect-{version('prefect')}.db"


def build_template(target: Path) -> Path:
    """Migrate an empty database to ``target`` with Prefect's own migrations (:data:`MIGRATE`);
    written beside under this process's and thread's name and renamed, so a concurrent builder
    never sees half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.{os.getpid()}-{threading.get_ident()}.partial"
    partial.unlink(missing_ok=True)  # left by a killed builder whose pid came round: SQLite makes it anew
    env = {
        **os.environ,
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{partial}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    try:
        subprocess.run(
            [sys.executable, "-c", MIGRATE], env=env, check=True, capture_output=True, text=True, timeout=600
        )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def database_chosen_elsewhere(environ: Mapping[str, str]) -> bool:
    """Whether the user pointed Prefect at a database of their own (environment or profile)."""
    if any(environ.get(name) for name in USER_DATABASE_SETTINGS):
        return True
    profiles = Path(environ.get("PREFECT_PROFILES_PATH") or Path.home() / ".prefect" / "profiles.toml")
    try:
        return "DATABASE_CONNECTION_URL" in profiles.read_text(encoding="utf-8")
    except OSError:
        return False


def seed_prefect_home(home: Path, environ: Mapping[str, str] = os.environ) -> bool:
    """Give ``home`` a migrated, empty ``prefect.db`` where it has none; whether it did.

    Best effort: where the template cannot be built or copied, Prefect migrates the new
    database itself, as it would have. A database that appears meanwhile is kept.
    """
    if (home / DATABASE).exists() or database_chosen_elsewhere(environ):
        return False
    copy = home / f".{DATABASE}.{os.getpid()}.copying"
    try:
        template = template_path()
        if not template.exists():
            build_template(template)
        shutil.copyfile(template, copy)
        os.link(copy, home / DATABASE)  # fails where a database appeared meanwhile
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        copy.unlink(missing_ok=True)
    return True


def seed_workspace_home(project_dir: str | Path = ".", environ: Mapping[str, str] = os.environ) -> bool:
    """:func:`seed_prefect_home` for the workspace's own Prefect home, where the flow is about to
    start Prefect's ephemeral API on it (no server in ``PREFECT_API_URL``, no home of the user's)."""
    home = Path(project_dir).resolve() / PREFECT_STATE
    if environ.get("PREFECT_API_URL") or environ.get("PREFECT_HOME") != str(home):
        return False
    return seed_prefect_home(home, environ)
