"""Quiet, local-first Prefect defaults for the CLI, applied before Prefect is imported.

Only fills in what the user has not set: no telemetry (this machine has no network and
the failed sends are noise), warnings-only logging on the console, and results stored
under the project so that cache hits never point at another clone's files.
"""

from __future__ import annotations

import logging
import os
import warnings
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
