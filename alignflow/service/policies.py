"""An agent's policies as the MLflow model registry knows them.

Each agent has a registered model ``<agent_id>-policy`` (and ``<agent_id>-reward``); every
version carries an ``agent_id`` tag and comes from a run whose metrics describe it. The
service reads the registry and never keeps a second list of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from alignflow.registry.models import register
from alignflow.registry.runs import ensure_experiment
from alignflow.service.estimate import JOB_SECONDS_METRIC, POLICY_SECONDS_METRIC, STEPS_METRIC
from alignflow.service.schemas import OnlineOut, PolicyOut

AGENT_TAG = "agent_id"
JOB_TAG = "alignflow.job_id"
DATA_VERSION_TAG = "data.version"
EXPERIMENT = "alignflow-service"

# run metric name -> wire name in a policy's ``metrics``
METRIC_NAMES = {
    "feedback_count": "feedbackCount",
    "training_steps": "trainingSteps",
    "reward_mean": "rewardMean",
    "reward_std": "rewardStd",
}


def policy_model_name(agent_id: str) -> str:
    return f"{agent_id}-policy"


def reward_model_name(agent_id: str) -> str:
    return f"{agent_id}-reward"


def job_metrics(
    feedback_count: int,
    training_steps: int,
    reward_mean: float | None,
    reward_std: float | None,
    policy_seconds: float | None,
    job_seconds: float | None,
) -> dict[str, float]:
    """What a finished job logs on its policy version's run (the listing and the estimate read it).

    Timings are left out when the policy came from a cache: they would claim a free step.
    """
    metrics = {"feedback_count": float(feedback_count), STEPS_METRIC: float(training_steps)}
    for key, value in (
        ("reward_mean", reward_mean),
        ("reward_std", reward_std),
        (POLICY_SECONDS_METRIC, policy_seconds),
        (JOB_SECONDS_METRIC, job_seconds),
    ):
        if value is not None:
            metrics[key] = float(value)
    return metrics


def record_job(tracking_uri: str, run_id: str, metrics: dict[str, float], tags: dict[str, str]) -> None:
    """Add a job's metrics and timing tags to an existing run (the flow's register run)."""
    client = MlflowClient(tracking_uri)
    for key, value in metrics.items():
        client.log_metric(run_id, key, value)
    for key, tag in tags.items():
        client.set_tag(run_id, key, tag)


def record_training(
    tracking_uri: str,
    agent_id: str,
    job_id: str,
    policy_dir: Path,
    reward_dir: Path | None,
    metrics: dict[str, float],
    params: dict[str, Any],
    artifact_root: Path,
    data_version: str | None = None,
    tags: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Log a finished job as an MLflow run and register its models; returns (run_id, policy version)."""
    client = MlflowClient(tracking_uri)
    experiment_id = ensure_experiment(tracking_uri, EXPERIMENT, str(artifact_root))
    lineage = {
        AGENT_TAG: agent_id,
        JOB_TAG: job_id,
        **({DATA_VERSION_TAG: data_version} if data_version else {}),
    }
    tags = {**lineage, **(tags or {})}
    run = client.create_run(experiment_id, run_name=f"{agent_id}-{job_id[:8]}", tags=tags)
    run_id = run.info.run_id
    try:
        for key, value in params.items():
            client.log_param(run_id, key, str(value)[:500])
        for key, value in metrics.items():
            client.log_metric(run_id, key, float(value))
        if reward_dir is not None:
            register(tracking_uri, str(reward_dir.resolve()), reward_model_name(agent_id), run_id, lineage)
        version = register(
            tracking_uri, str(policy_dir.resolve()), policy_model_name(agent_id), run_id, lineage
        )
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    return run_id, version.version


def _run_metrics(client: MlflowClient, run_id: str | None) -> dict[str, float]:
    if not run_id:
        return {}
    try:
        metrics = client.get_run(run_id).data.metrics
    except MlflowException:
        return {}
    return {METRIC_NAMES.get(k, k): v for k, v in metrics.items()}


def list_policies(
    tracking_uri: str, agent_id: str, online: dict[str, OnlineOut] | None = None
) -> list[PolicyOut]:
    """The agent's registered policy versions with their run metrics, newest first.

    ``online``: ratings of each version's served completions, by version number.
    """
    client = MlflowClient(tracking_uri)
    name = policy_model_name(agent_id)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return []
    if not versions:
        return []
    # search results leave aliases empty: read them from the registered model
    aliases: dict[str, list[str]] = {}
    for alias, number in (client.get_registered_model(name).aliases or {}).items():
        aliases.setdefault(str(number), []).append(alias)
    policies = []
    for mv in versions:
        if mv.tags.get(AGENT_TAG) != agent_id:
            continue  # not recorded for this agent: never show it under its name
        policies.append(
            PolicyOut(
                id=f"models:/{name}/{mv.version}",
                agent_id=agent_id,
                version=f"v{mv.version}",
                created_at=datetime.fromtimestamp(mv.creation_timestamp / 1000, tz=UTC),
                model_path=mv.source,
                aliases=sorted(aliases.get(str(mv.version), [])),
                metrics=_run_metrics(client, mv.run_id),
                online=(online or {}).get(str(mv.version))
                or OnlineOut(count=0, mean_score=None, low=None, high=None),
            )
        )
    return sorted(policies, key=lambda p: int(p.version[1:]), reverse=True)
