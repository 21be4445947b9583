"""Stage subflows: each can run in-process under the parent or as its own deployment.

A stage flow takes one JSON-able parameter (:class:`~alignflow.tasks.stage_inputs.StageInputs`:
the config as a dict, paths, hashes) and returns a small dict, so the parent can call it
directly or through ``run_deployment`` on a GPU work pool with the same code. A cached
result whose files are gone (a cleaned output folder, another clone) or whose run is not in
the tracking store (a deleted ``mlflow.db``, a new server) is recomputed rather than trusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Flow, Task, flow

from alignflow.flows.run_log import logs_to_the_run
from alignflow.registry.pipeline_record import SHORT_VERSION
from alignflow.registry.runs import run_exists
from alignflow.tasks.evaluation import evaluate
from alignflow.tasks.stage_inputs import EvaluateInputs, StageInputs
from alignflow.tasks.stage_task import pipeline_config
from alignflow.tasks.training import train_policy, train_reward, train_sft

STAGE_OPTIONS: dict[str, Any] = {"persist_result": True, "log_prints": False}


def stage_run_name(stage: str) -> str:
    """``<project>-<stage>-<short data version>``: a stage's flow run says what it trained on
    (a ``flow_run_name`` template over the validated :class:`StageInputs`)."""
    return f"{{inputs.config_json[project]}}-{stage}-{{inputs.data_version:.{SHORT_VERSION}}}"


def reusable(result: dict[str, Any], artefact: str, inputs: StageInputs) -> bool:
    """A cached result stands for work done only while its files exist and the run that did
    it is in this run's tracking store: after ``mlflow.db`` is deleted, or with a new tracking
    server, the hit would point at a run nobody can open."""
    if not Path(result[artefact]).exists():
        return False
    run_id = result.get("run_id")
    return not run_id or run_exists(pipeline_config(inputs.config_json).tracking.resolved_uri(), run_id)


def run_cached(task_fn: Task[[Any], dict[str, Any]], inputs: StageInputs, artefact: str) -> dict[str, Any]:
    """Run ``task_fn``; report whether the cache answered, refreshing it when the hit is not
    :func:`reusable`.

    Our log lines go to the stage's run also where it runs as a deployment on a worker (in
    the parent's process they already do)."""
    with logs_to_the_run():
        state = task_fn(inputs, return_state=True)
        result = state.result()
        cached = state.name == "Cached"
        if cached and not reusable(result, artefact, inputs):
            state = task_fn.with_options(refresh_cache=True)(inputs, return_state=True)
            result, cached = state.result(), False
    return {**result, "cached": cached}


@flow(name="stage-sft", flow_run_name=stage_run_name("sft"), **STAGE_OPTIONS)
def sft_stage(inputs: StageInputs) -> dict[str, Any]:
    """Supervised fine-tuning."""
    return run_cached(train_sft, inputs, "model_dir")


@flow(name="stage-reward", flow_run_name=stage_run_name("reward"), **STAGE_OPTIONS)
def reward_stage(inputs: StageInputs) -> dict[str, Any]:
    """Reward-model training."""
    return run_cached(train_reward, inputs, "model_dir")


@flow(name="stage-policy", flow_run_name=stage_run_name("policy"), **STAGE_OPTIONS)
def policy_stage(inputs: StageInputs) -> dict[str, Any]:
    """Policy optimisation (DPO family, GRPO or PPO, from the config)."""
    return run_cached(train_policy, inputs, "model_dir")


@flow(name="stage-evaluate", flow_run_name=stage_run_name("evaluate"), **STAGE_OPTIONS)
def evaluate_stage(inputs: EvaluateInputs) -> dict[str, Any]:
    """Evaluation of the reward model and the policy."""
    return run_cached(evaluate, inputs, "report")


STAGE_FLOWS: dict[str, Flow[..., dict[str, Any]]] = {
    "sft": sft_stage,
    "reward": reward_stage,
    "policy": policy_stage,
    "evaluate": evaluate_stage,
}
