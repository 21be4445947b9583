"""Prefect tasks around the MLflow registry: register both models, then gate the promotion."""

from __future__ import annotations

from typing import Any

from prefect import task

from alignflow.kill_points import kill_point
from alignflow.tasks.caching import stage_cache_key
from alignflow.tasks.retry import retry_transient
from alignflow.tasks.stage_task import pipeline_config, run_in_stage

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
    data_tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Log each model (policy and reward: alignflow's pyfuncs, the policy serving with the
    evaluation's decoding and dtype) and register it; new versions become ``challenger``.

    ``data_tags``: what the data version says of itself that every model trained on it must
    show (the reason its unjudged pairs were accepted: a tag and the version's description).

    ``trained_by`` names each role's training stage run. A role in ``cache_hits`` (its
    training stage was a cache hit) whose stage output is already registered is reused:
    nothing is logged, the version keeps its aliases, and the entry says ``reused``.
    """
    config = pipeline_config(config_json)
    uri = config.tracking.resolved_uri()

    def call() -> dict[str, Any]:
        from alignflow.models.factory import inference_dtype
        from alignflow.models.real_models import base_weights_sha256
        from alignflow.registry.models import BASE_WEIGHTS_TAG, registered_name
        from alignflow.registry.runs import lineage_tags

        dtype = inference_dtype(config.model)
        served = {
            "evaluation": config.evaluation,
            "dtype": str(dtype).removeprefix("torch.") if dtype else None,
        }

        tags = {**config.tracking.tags, **lineage_tags(data_version, config_hash), **(data_tags or {})}
        # the policy's base weights (the reward model may start from another model)
        base_sha = base_weights_sha256(config.model.name)
        versions = {}
        for role, model_dir in model_dirs.items():
            name = registered_name(config.project, role)
            stage_run = (trained_by or {}).get(role)
            reused = reused_version(uri, name, stage_run, model_dir) if role in (cache_hits or ()) else None
            role_tags = {**tags, BASE_WEIGHTS_TAG: base_sha} if role == "policy" and base_sha else tags
            made = reused or register_version(uri, name, role, model_dir, stage_run, role_tags, served)
            versions[role] = made
        kill_point("register.done")
        return {"versions": versions}

    return run_in_stage("register", config, parent_run_id, call)


def reused_version(uri: str, name: str, stage_run: str | None, model_dir: str) -> dict[str, Any] | None:
    """The registered version logged from this (cached) stage output, as a ``versions`` entry.

    A version with no decision yet was registered by a run killed before it promoted: it is
    this run's challenger, made again (the alias a kill may have cut off) and decided by the
    promote task, not registered twice and not passed over as already decided.
    """
    from mlflow import MlflowClient

    from alignflow.registry.decision_tags import DECISION_TAG
    from alignflow.registry.lineage import producing_pipeline_run, version_from_stage
    from alignflow.registry.models import CHALLENGER

    version = version_from_stage(uri, name, stage_run, model_dir)
    if version is None:
        return None
    if DECISION_TAG not in (version.tags or {}):
        MlflowClient(uri).set_registered_model_alias(name, CHALLENGER, str(version.version))
        number = str(version.version)
        return {"name": name, "version": number, "model_uri": f"models:/{name}/{number}"}
    return {
        "name": name,
        "version": str(version.version),
        "model_uri": f"models:/{name}/{version.version}",
        "reused": True,
        "produced_by_run": producing_pipeline_run(uri, version) or version.run_id,
    }


def register_version(
    uri: str,
    name: str,
    role: str,
    model_dir: str,
    stage_run: str | None,
    tags: dict[str, str],
    served: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Log and register a new version, tagged with the stage output it came from; ``served``:
    :func:`~alignflow.registry.models.log_model`'s ``evaluation`` and ``dtype``."""
    from alignflow.registry.lineage import stage_output_tags
    from alignflow.registry.models import log_model
    from alignflow.registry.runs import ACCEPTED_UNJUDGED_TAG

    version_tags = {**tags, **stage_output_tags(model_dir, stage_run)}
    logged = log_model(
        model_dir, uri, registered_model_name=name, name=role, tags=version_tags, **(served or {})
    )
    if logged is None:
        raise RuntimeError(f"{model_dir}: logging it as {name} registered no version")
    accepted = tags.get(ACCEPTED_UNJUDGED_TAG)
    if accepted:
        from mlflow import MlflowClient

        MlflowClient(uri).update_model_version(
            name,
            logged.version,
            description=f"Trained on data with pairs no judge could judge, accepted: {accepted}",
        )
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
    slices: dict[str, list[dict[str, Any]]] | None = None,
    discredited_judges: list[str] | None = None,
) -> dict[str, Any]:
    """Move ``champion`` for each role only when every configured gate passes.

    The reward model's own gates are read first: only a reward model that passed them may
    then judge the policy (beside the champion reward model and any plugged-in judge), and
    only judges that pass their audit against the verifiable answers count. With
    ``promotion.release: together`` the reward model is then promoted only with its policy.
    ``slices``: the evaluation's worst slices per role (``policy_slices``, ``reward_slices``),
    named in the slice gate's verdict. Each decision's gate table is logged to the promote run.
    ``discredited_judges``: judges that failed an audit earlier in this run (the label check's,
    against the new data's verifiable answers): they count nowhere in it.
    """
    config = pipeline_config(config_json)
    uri = config.tracking.resolved_uri()

    def call() -> dict[str, Any]:
        from alignflow.promotion.gates import audit_judges, slice_details
        from alignflow.registry.decision_card import decision_entry, log_decision
        from alignflow.registry.promotion import promote

        decisions: dict[str, Any] = {}
        reward = versions.get("reward")
        limit = config.promotion.max_slice_regression
        details = {role: slice_details((slices or {}).get(f"{role}_slices"), limit) for role in versions}
        if reward is not None and reward.get("reused"):  # decided when it was registered
            decisions["reward"] = reused_decision(uri, reward)
            reward_trusted = decisions["reward"]["promoted"]
        else:
            reward_trusted = reward is not None and passes_own_gates(uri, reward, metrics, config, details)
        policy = versions.get("policy")
        if policy is not None:
            if policy.get("reused"):
                decisions["policy"] = reused_decision(uri, policy)
            else:
                audits = audit_judges(metrics, reward_trusted, config.promotion)
                audits = {j: discredit(a, discredited_judges) for j, a in audits.items()}
                judges = [j for j, audit in audits.items() if audit.counts]
                decision = promote(
                    uri, policy["name"], policy["version"], metrics, config.promotion, "policy", judges,
                    tags, details=details["policy"], audits=audits,
                )  # fmt: skip
                log_decision("policy", decision)
                decisions["policy"] = decision_entry(decision)
        if reward is not None and not reward.get("reused"):
            with_policy = decisions["policy"]["promoted"] if policy is not None else None
            decision = promote(
                uri, reward["name"], reward["version"], metrics, config.promotion, "reward", (), tags,
                details=details["reward"], policy_promoted=with_policy,
            )  # fmt: skip
            log_decision("reward", decision)
            decisions["reward"] = decision_entry(decision)
        return {
            "decisions": {role: decisions[role] for role in sorted(decisions, key=lambda r: r != "reward")}
        }

    return run_in_stage("promote", config, parent_run_id, call)


def discredit(audit: Any, discredited: list[str] | None) -> Any:
    """A judge's audit, failed where the judge failed the label check's audit in this run."""
    from dataclasses import replace

    if audit.judge not in (discredited or ()):
        return audit
    why = "not counted: failed the label check's audit against the new data's verifiable answers"
    return replace(audit, counts=False, reason=f"{why} (and on the pinned set: {audit.reason})")


def passes_own_gates(
    uri: str, info: dict[str, Any], metrics: dict[str, float], config: Any, details: dict[str, dict[str, str]]
) -> bool:
    """Whether the run's reward model passes its own gates (nothing written): then it may judge."""
    from alignflow.promotion.gates import decide
    from alignflow.registry.models import CHAMPION, version_by_alias

    current = version_by_alias(uri, info["name"], CHAMPION)
    champion = str(current.version) if current is not None else None
    decision = decide(
        info["name"],
        info["version"],
        metrics,
        config.promotion,
        "reward",
        champion,
        details=details["reward"],
    )
    return decision.promoted


def reused_decision(uri: str, info: dict[str, Any]) -> dict[str, Any]:
    """A reused version's entry among the decisions: unchanged, ``promoted`` while it holds
    ``champion`` (so a reused champion reward model stays a trusted judge, as when it won)."""
    from alignflow.registry.decision_card import reused_entry
    from alignflow.registry.models import CHAMPION, alias_version

    champion = alias_version(uri, info["name"], CHAMPION) == str(info["version"])
    return reused_entry(info["name"], str(info["version"]), info["produced_by_run"], champion)
