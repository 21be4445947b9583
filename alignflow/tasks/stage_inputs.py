"""What a stage task (and the subflow around it) receives: one JSON-able model, not loose kwargs.

Prefect builds a deployment's parameter schema from it, ``run_deployment`` sends it as
plain JSON to a worker on another machine, and the cache key reads its data version,
config hash and upstream. Paths and hashes only, never models or frames.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class StageInputs(BaseModel):
    """A training stage's inputs: the pipeline config, where the data and outputs live, lineage."""

    model_config = ConfigDict(extra="forbid")

    config_json: dict[str, Any]
    data_dir: str
    output_dir: str
    data_version: str
    config_hash: str
    upstream: str = ""  # what the stage builds on (upstream models, champion): part of its cache key
    model_path: str | None = None
    parent_run_id: str | None = None


class EvaluateInputs(StageInputs):
    """The evaluation stage also names the models it compares."""

    policy_dir: str
    reference_dir: str
    rl_start_dir: str | None = None  # the model the RL stage started from (reference_dir when the same)
    reward_dir: str
    champion_dir: str | None = None
    champion_reward_dir: str | None = None
    golden_path: str | None = None
