"""Prefect tasks around the MLflow registry: register both models, then gate the promotion."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.caching import stage_cache_key
from tasks.retry import retry_transient
from tasks.stage_task import pipeline_config, run_in_stage

REGISTRY_OPTIONS: dict[str, Any] = {
    "cache_key_fn": stage_cache_key,
    "persist_result": True,
    "retries": 3,
    "retry_delay_seconds": 5,
    "retry_condition_fn": retry_transient,
}


@task(name="register", **REGISTRY_OPTIONS)
def register_models(
    config_json: dict,
    model_dirs: dict[str, str],
    data_version: str,
    config_hash: str,
    upstream: str = "",
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Log each model (policy: transformers flavour, reward: alignflow's reward pyfunc) and
    register it; new versions become ``challenger``."""
    config = pipeline_config(config_json)
    uri = config.tracking.resolved_uri()

    def call() -> dict[str, Any]:
        from alignflow.registry.models import log_model, registered_name
        from alignflow.registry.runs import lineage_tags

        tags = {**config.tracking.tags, **lineage_tags(data_version, config_hash)}
        versions = {}
        for role, model_dir in model_dirs.items():
            name = registered_name(config.project, role)
            logged = log_model(model_dir, uri, registered_model_name=name, name=role, tags=tags)
            versions[role] = {"name": name, "version": logged.version, "model_uri": logged.model_uri}
        return {"versions": versions}

    return run_in_stage("register", config, parent_run_id, call)


@task(name="promote", **REGISTRY_OPTIONS)
def promote_models(
    config_json: dict,
    versions: dict[str, dict[str, str]],
    metrics: dict[str, float],
    data_version: str,
    config_hash: str,
    upstream: str = "",
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Move ``champion`` for each role only when every configured gate passes.

    The reward model is judged first: only a reward model that passed its own gates may
    then judge the policy (beside the champion reward model and any plugged-in judge).
    """
    config = pipeline_config(config_json)
    uri = config.tracking.resolved_uri()

    def call() -> dict[str, Any]:
        from alignflow.registry.promotion import promote, trusted_judges

        decisions = {}
        reward_trusted = False
        for role in sorted(versions, key=lambda r: r != "reward"):
            info = versions[role]
            judges = trusted_judges(metrics, reward_trusted) if role == "policy" else ()
            decision = promote(
                uri, info["name"], info["version"], metrics, config.promotion, role, judges, tags
            )
            reward_trusted = reward_trusted or (role == "reward" and decision.promoted)
            decisions[role] = {
                "name": info["name"],
                "version": info["version"],
                "promoted": decision.promoted,
                "reason": decision.reason,
                "failed": [r.name for r in decision.failed],
                "judges": list(decision.judges),
                "gates": [
                    {"name": r.name, "outcome": r.outcome, "describe": r.describe()} for r in decision.results
                ],
            }
        return {"decisions": decisions}

    return run_in_stage("promote", config, parent_run_id, call)
