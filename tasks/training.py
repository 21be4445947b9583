"""Prefect tasks for the training stages: each wraps one ``alignflow.training`` call.

Cached on (data version, stage config hash, code version, upstream model): an unchanged
stage is not retrained. Output folders are derived from the same inputs, so a run that
crashed mid-stage resumes from that stage's last complete checkpoint when started again.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import task

from alignflow.training.launch import launch_stage
from tasks.caching import stage_cache_key
from tasks.retry import retry_transient
from tasks.stage_task import pipeline_config, run_in_stage

TASK_OPTIONS: dict[str, Any] = {
    "cache_key_fn": stage_cache_key,
    "persist_result": True,
    "retries": 2,
    "retry_delay_seconds": 5,
    "retry_condition_fn": retry_transient,
}


def _train(
    stage: str, runner: str, config_json, data_dir, output_dir, model_path, parent_run_id
) -> dict[str, Any]:
    """Run ``runner`` (a stage name for launch_stage) in the stage's MLflow run, on 1 or N processes."""
    config = pipeline_config(config_json)

    def call() -> dict[str, Any]:
        return asdict(launch_stage(runner, config, data_dir, output_dir, model_path))

    return run_in_stage(stage, config, parent_run_id, call)


@task(name="sft", **TASK_OPTIONS)
def train_sft(
    config_json: dict,
    data_dir: str,
    output_dir: str,
    data_version: str,
    config_hash: str,
    upstream: str = "",
    model_path: str | None = None,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Supervised fine-tuning on the preferred responses."""
    return _train("sft", "sft", config_json, data_dir, output_dir, model_path, parent_run_id)


@task(name="reward", **TASK_OPTIONS)
def train_reward(
    config_json: dict,
    data_dir: str,
    output_dir: str,
    data_version: str,
    config_hash: str,
    upstream: str = "",
    model_path: str | None = None,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Reward model (Bradley-Terry, regression or multi-objective)."""
    return _train("reward", "reward", config_json, data_dir, output_dir, model_path, parent_run_id)


@task(name="policy", **TASK_OPTIONS)
def train_policy(
    config_json: dict,
    data_dir: str,
    output_dir: str,
    data_version: str,
    config_hash: str,
    upstream: str = "",
    model_path: str | None = None,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Policy optimisation with the algorithm the config names (DPO family, GRPO, PPO)."""
    algorithm = pipeline_config(config_json).policy.algorithm
    return _train("policy", algorithm, config_json, data_dir, output_dir, model_path, parent_run_id)
