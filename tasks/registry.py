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
    trained_by: dict[str, str] | None = None,
    cache_hits: list[str] | None = None,
) -> dict[str, Any]:
    """Log each model (policy: transformers flavour, reward: alignflow's reward pyfunc) and
    register it; new versions become ``challenger``.

    ``trained_by`` names each role's training stage run. A role in ``cache_hits`` (its
    training stage was a cache hit) whose stage output is already registered is reused:
    nothing is logged, the version keeps its aliases, and the entry says ``reused``.
    """
    config = pipeline_config(config_json)
    uri = config.tracking.resolved_uri()

    def call() -> dict[str, Any]:
        from alignflow.registry.models import registered_name
        from alignflow.registry.runs import lineage_tags

        tags = {**config.tracking.tags, **lineage_tags(data_version, config_hash)}
        versions = {}
        for role, model_dir in model_dirs.items():
            name = registered_name(config.project, role)
            stage_run = (trained_by or {}).get(role)
            reused = reused_version(uri, name, stage_run, model_dir) if role in (cache_hits or ()) else None
            versions[role] = reused or register_version(uri, name, role, model_dir, stage_run, tags)
        return {"versions": versions}

    return run_in_stage("register", config, parent_run_id, call)


def reused_version(uri: str, name: str, stage_run: str | None, model_dir: str) -> dict[str, Any] | None:
    """The registered version logged from this (cached) stage output, as a ``versions`` entry."""
    from alignflow.registry.lineage import producing_pipeline_run, version_from_stage

    version = version_from_stage(uri, name, stage_run, model_dir)
    if version is None:
        return None
    return {
        "name": name,
        "version": str(version.version),
        "model_uri": f"models:/{name}/{version.version}",
        "reused": True,
        "produced_by_run": producing_pipeline_run(uri, version) or version.run_id,
    }


def register_version(
    uri: str, name: str, role: str, model_dir: str, stage_run: str | None, tags: dict[str, str]
) -> dict[str, Any]:
    """Log and register a new version, tagged with the stage output it came from."""
    from alignflow.registry.lineage import stage_output_tags
    from alignflow.registry.models import log_model

    version_tags = {**tags, **stage_output_tags(model_dir, stage_run)}
    logged = log_model(model_dir, uri, registered_model_name=name, name=role, tags=version_tags)
    return {"name": name, "version": logged.version, "model_uri": logged.model_uri}


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
    Each decision's gate table is logged to the promote run (metrics, markdown, JSON).
    """
    config = pipeline_config(config_json)
    uri = config.tracking.resolved_uri()

    def call() -> dict[str, Any]:
        from alignflow.registry.decision_card import log_decision
        from alignflow.registry.promotion import promote, trusted_judges

        decisions = {}
        reward_trusted = False
        for role in sorted(versions, key=lambda r: r != "reward"):
            info = versions[role]
            if info.get("reused"):  # decided when it was registered: not judged again
                decisions[role] = reused_decision(uri, info)
                reward_trusted = reward_trusted or (role == "reward" and decisions[role]["promoted"])
                continue
            judges = trusted_judges(metrics, reward_trusted) if role == "policy" else ()
            decision = promote(
                uri, info["name"], info["version"], metrics, config.promotion, role, judges, tags
            )
            reward_trusted = reward_trusted or (role == "reward" and decision.promoted)
            log_decision(role, decision)
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


def reused_decision(uri: str, info: dict[str, Any]) -> dict[str, Any]:
    """A reused version's entry among the decisions: unchanged, ``promoted`` while it holds
    ``champion`` (so a reused champion reward model stays a trusted judge, as when it won)."""
    from alignflow.registry.models import CHAMPION, alias_version

    champion = alias_version(uri, info["name"], CHAMPION) == str(info["version"])
    held = "it stays champion" if champion else "it is not the champion"
    return {
        "name": info["name"],
        "version": info["version"],
        "promoted": champion,
        "reused": True,
        "produced_by_run": info["produced_by_run"],
        "reason": f"unchanged (reused, produced by run {info['produced_by_run']}); {held}",
        "failed": [],
        "judges": [],
        "gates": [],
    }
