"""The shape every training/evaluation task shares: a nested MLflow run around one library call.

A task receives the pipeline config as JSON (so it can cross process and machine
boundaries), runs the library function inside a stage run nested under the pipeline's
parent run, and returns a small dict: paths, metrics, timings, its cost. Never models.
Tasks import the library inside ``call``, so a stage's compute time includes loading its
code, as it would on a worker; what remains outside is the orchestration's own cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from alignflow.config import PipelineConfig
from alignflow.evaluation.cost import timed
from alignflow.registry import tracking
from alignflow.registry.runs import stage_run


def pipeline_config(config_json: dict[str, Any]) -> PipelineConfig:
    return PipelineConfig.model_validate(config_json)


def run_in_stage(
    stage: str,
    config: PipelineConfig,
    parent_run_id: str | None,
    call: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """Run ``call`` inside the stage's nested run (or bare when no parent run is given); its
    wall, CPU and GPU seconds go on that run as ``cost/*`` and, with what its training ran
    (the ``cost`` of a stage result), into the returned ``cost``."""
    started = time.perf_counter()
    if parent_run_id is None:
        outcome, spent = timed(call)
        run_id = None
    else:
        with stage_run(config.tracking.resolved_uri(), parent_run_id, stage) as run:
            outcome, spent = timed(call)
            tracking.log_metrics(spent)
            run_id = run.info.run_id
    cost = {**(outcome.get("cost") or {}), **spent}
    return {
        **outcome,
        "stage": stage,
        "run_id": run_id,
        "compute_seconds": time.perf_counter() - started,
        "cost": cost,
    }
