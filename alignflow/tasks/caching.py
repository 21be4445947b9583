"""Cache keys for pipeline tasks: (data version, config section hash, code version).

A stage is retrained only when one of the three changes. The code version hashes the
library's source, so editing a trainer invalidates its cached results while a README edit
does not. Keys are built from the task's explicit inputs, never from model objects.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel

from alignflow.code_version import package_digest

CACHE_INPUTS = ("data_version", "config_hash", "upstream")


def stage_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Prefect ``cache_key_fn``: the task name plus its data version, config hash and code version.

    Reads a stage task's ``inputs`` model, or the registry tasks' keyword arguments.
    """
    inputs = parameters.get("inputs")
    values = inputs.model_dump() if isinstance(inputs, BaseModel) else parameters
    parts = [context.task.name, package_digest()]
    parts += [str(values.get(name, "")) for name in CACHE_INPUTS]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()
