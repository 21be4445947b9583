"""Quiet, local-first Prefect defaults for the CLI, applied before Prefect is imported.

Only fills in what the user has not set: no telemetry (this machine has no network and
the failed sends are noise), warnings-only logging on the console, and Prefect's home (its
database of flow runs) and results under the project, beside its ``mlflow.db``, so that a
second clone's UI never shows the first one's runs and cache hits never point at its files.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "False",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    # the ephemeral API can take a while on a loaded 2-core machine
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # model load/save bars; the trainers' own bars follow TRANSFORMERS_VERBOSITY
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


# what ties a command to the calling session's store and Prefect API
SESSION_SETTINGS = ("MLFLOW_TRACKING_URI", "PREFECT_API_", "PREFECT_HOME")


def workspace_environment(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without :data:`SESSION_SETTINGS` (and ``drop``): a command
    started in another folder then uses that folder's own store and Prefect home
    (:func:`workspace_prefect_home`), as a user's shell there would."""
    foreign = SESSION_SETTINGS + drop
    return {key: value for key, value in os.environ.items() if not key.startswith(foreign)}


# Prefect's home in a workspace (git-ignored with the rest of .alignflow/): prefect.db, storage
PREFECT_STATE = Path(".alignflow") / "prefect"


def workspace_prefect_home(
    project_dir: str | Path = ".", environ: Mapping[str, str] = os.environ
) -> Path | None:
    """Where Prefect keeps this workspace's flow runs; None where the user chose already.

    A server (``PREFECT_API_URL``) holds its own runs, and a ``PREFECT_HOME`` the user set is
    theirs to keep; otherwise the ephemeral API's database goes in the workspace, as MLflow's.
    """
    if environ.get("PREFECT_HOME") or environ.get("PREFECT_API_URL"):
        return None
    return Path(project_dir).resolve() / PREFECT_STATE


def use_workspace_prefect_home(project_dir: str | Path = ".") -> Path | None:
    """Point Prefect at the workspace's home, before Prefect is imported (it reads its
    settings once, then); returns the home set, or None where nothing changed.

    The user's profiles (``~/.prefect/profiles.toml``: a server or Prefect Cloud chosen with
    ``prefect config set``) still apply: only the database and files move.
    """
    home = workspace_prefect_home(project_dir)
    if home is None or "prefect" in sys.modules:  # too late: this process keeps the one it read
        return None
    profiles = Path("~/.prefect/profiles.toml").expanduser()
    if profiles.exists():
        os.environ.setdefault("PREFECT_PROFILES_PATH", str(profiles))
    home.mkdir(parents=True, exist_ok=True)  # Prefect makes its home, but not .alignflow/ above it
    os.environ["PREFECT_HOME"] = str(home)
    return home


def prefect_ui_command(project_dir: str | Path = ".") -> str:
    """How to see this workspace's flow runs: a bare ``prefect server start`` would show
    ``~/.prefect``'s, not the ones the run just wrote."""
    api = os.environ.get("PREFECT_API_URL")
    if api:
        return f"browse {api.removesuffix('/').removesuffix('/api')}   # the server in PREFECT_API_URL"
    command = "prefect server start   # then browse http://127.0.0.1:4200"
    home = os.environ.get("PREFECT_HOME")
    if not home:
        return command
    with suppress(ValueError):  # a home outside the workspace is named in full
        home = str(Path(home).resolve().relative_to(Path(project_dir).resolve()))
    return f"PREFECT_HOME={home} {command}"


def apply_defaults(project_dir: str | Path = ".") -> None:
    use_workspace_prefect_home(project_dir)
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    # library deprecation chatter and MLflow's hub look-ups are not the user's concern
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    storage = Path(project_dir).resolve() / ".alignflow" / "prefect-results"
    os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str(storage))


@contextmanager
def local_flow_settings() -> Iterator[None]:
    """Settings for a flow run in this process on Prefect's ephemeral API.

    Heartbeats let a server spot crashed runs of its workers; an ephemeral API lives and
    dies with this process, so they protect nothing there, while each (sub)flow's
    heartbeat thread holds up its exit for up to a second. With a server configured
    (``PREFECT_API_URL``) nothing changes.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
