"""Prefect tasks for the training stages: each wraps one ``alignflow.training`` call.

Cached on (data version, stage config hash, code version, upstream model): an unchanged
stage is not retrained. Output folders are derived from the same inputs, so a run that
crashed mid-stage resumes from that stage's last complete checkpoint when started again.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import task

from alignflow.tasks.caching import stage_cache_key
from alignflow.tasks.retry import retry_transient
from alignflow.tasks.stage_inputs import StageInputs
from alignflow.tasks.stage_task import pipeline_config, run_in_stage
from alignflow.training.launch import launch_stage

TASK_OPTIONS: dict[str, Any] = {
    "cache_key_fn": stage_cache_key,
    "persist_result": True,
    "retries": 2,
    "retry_delay_seconds": 5,
    "retry_condition_fn": retry_transient,
}


def _train(stage: str, runner: str, inputs: StageInputs) -> dict[str, Any]:
    """Run ``runner`` (a stage name for launch_stage) in the stage's MLflow run, on 1 or N processes."""
    config = pipeline_config(inputs.config_json)

    def call() -> dict[str, Any]:
        result = launch_stage(runner, config, inputs.data_dir, inputs.output_dir, inputs.model_path)
        return asdict(result)

    return run_in_stage(stage, config, inputs.parent_run_id, call)


@task(name="sft", **TASK_OPTIONS)
def train_sft(inputs: StageInputs) -> dict[str, Any]:
    """Supervised fine-tuning on the preferred responses."""
    return _train("sft", "sft", inputs)


@task(name="reward", **TASK_OPTIONS)
def train_reward(inputs: StageInputs) -> dict[str, Any]:
    """Reward model (Bradley-Terry, regression or multi-objective)."""
    return _train("reward", "reward", inputs)


@task(name="policy", **TASK_OPTIONS)
def train_policy(inputs: StageInputs) -> dict[str, Any]:
    """Policy optimisation with the algorithm the config names (DPO family, GRPO, PPO)."""
    algorithm = pipeline_config(inputs.config_json).policy.algorithm
    return _train("policy", algorithm, inputs)
