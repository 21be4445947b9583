"""Quiet, local-first Prefect defaults for the CLI, applied before Prefect is imported.

Only fills in what the user has not set: no telemetry (this machine has no network and
the failed sends are noise), warnings-only logging on the console, and results stored
under the project so that cache hits never point at another clone's files.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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


def apply_defaults(project_dir: str | Path = ".") -> None:
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
