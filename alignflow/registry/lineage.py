"""Where a registered model came from, read back from the registry and the runs behind it.

A version registered by the pipeline carries lineage tags (data version, config hash, git
commit) and points at its stage run, whose parent run holds the pipeline's summary. From
these the flow decides whether a run has anything to do, shows the champion's stages as
cache hits, and fetches the champion to compare a challenger with.

Each version also names the training stage run that wrote its weights, so a later run whose
training stage was a cache hit finds that version and reuses it instead of registering a copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mlflow is imported only when the registry is read (the CLI stays quick)
    from mlflow.entities.model_registry import ModelVersion

PARENT_RUN_TAG = "mlflow.parentRunId"
SUMMARY_ARTIFACT = "summary.json"  # the pipeline's summary on its parent run
TRAINED_BY_RUN_TAG = "alignflow.trained_by_run"  # the training stage run that wrote the weights
SOURCE_DIR_TAG = "alignflow.source_dir"  # the stage output folder the version was logged from
REUSED_FROM_RUN_TAG = "{role}.reused_from_run"  # on a pipeline run that reused a role's version
REUSED_VERSION_TAG = "{role}.reused_version"


def champion_version(tracking_uri: str, project: str, role: str = "policy") -> ModelVersion | None:
    """The version a project's ``champion`` alias points at for ``role``, if any."""
    from alignflow.registry import models as registry_models

    name = registry_models.registered_name(project, role)
    return registry_models.version_by_alias(tracking_uri, name, registry_models.CHAMPION)


def trained_on(version: ModelVersion, data_version: str, cfg_hash: str) -> bool:
    """Whether a version's lineage tags name this data version and config."""
    from alignflow.registry.runs import CONFIG_HASH_TAG, DATA_VERSION_TAG

    tags = version.tags or {}
    return tags.get(DATA_VERSION_TAG) == data_version and tags.get(CONFIG_HASH_TAG) == cfg_hash


def producing_pipeline_run(tracking_uri: str, version: ModelVersion) -> str | None:
    """The id of the pipeline (parent) run that registered ``version``; None for one registered
    by hand or whose run is gone."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if not version.run_id:
        return None
    try:
        return MlflowClient(tracking_uri).get_run(version.run_id).data.tags[PARENT_RUN_TAG]
    except (KeyError, MlflowException):
        return None


def run_finished(tracking_uri: str, version: ModelVersion) -> bool:
    """Whether the pipeline run that registered ``version`` ran to its end. A run killed after
    it moved ``champion`` did not: its other decisions and its summary are still to come, so a
    rerun on the same data and config has work left (registered by hand: nothing to finish)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    parent_id = producing_pipeline_run(tracking_uri, version)
    if parent_id is None:
        return True
    try:
        return MlflowClient(tracking_uri).get_run(parent_id).info.status == "FINISHED"
    except MlflowException:
        return True  # the run is gone: nothing of it to finish


def pipeline_summary(tracking_uri: str, version: ModelVersion) -> dict[str, Any] | None:
    """The summary of the pipeline run that trained ``version``; None for one registered by hand."""
    import mlflow
    from mlflow.exceptions import MlflowException

    parent_id = producing_pipeline_run(tracking_uri, version)
    if parent_id is None:
        return None
    try:
        mlflow.set_tracking_uri(tracking_uri)
        return mlflow.artifacts.load_dict(f"runs:/{parent_id}/{SUMMARY_ARTIFACT}")
    except (OSError, MlflowException):
        return None  # not a pipeline run (or it is gone)


def stage_output_tags(model_dir: str | Path, trained_by_run: str | None) -> dict[str, str]:
    """The version tags naming the stage output a model was logged from (see :func:`version_from_stage`)."""
    tags = {SOURCE_DIR_TAG: str(model_dir)}
    return {**tags, TRAINED_BY_RUN_TAG: trained_by_run} if trained_by_run else tags


def version_from_stage(
    tracking_uri: str, name: str, trained_by_run: str | None, model_dir: str | Path
) -> ModelVersion | None:
    """The newest version of ``name`` logged from this stage output: trained by that stage run
    and logged from that folder. None when there is none (never registered, or registry wiped).

    The run id alone is the search filter (MLflow's SQL store filters on ``name`` and
    ``tags.<key>`` with ``=``); the folder, which may hold any character, is compared here.
    """
    from mlflow import MlflowClient

    if not trained_by_run:
        return None
    query = f"name = '{name}' AND tags.`{TRAINED_BY_RUN_TAG}` = '{trained_by_run}'"
    found = [
        v
        for v in MlflowClient(tracking_uri).search_model_versions(query)
        if (v.tags or {}).get(SOURCE_DIR_TAG) == str(model_dir)
    ]
    return max(found, key=lambda v: int(v.version), default=None)


def link_reused_version(tracking_uri: str, run_id: str, role: str, version: str, produced_by: str) -> None:
    """Tag a pipeline run with the version it reused for ``role`` and the run that produced it."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    client.set_tag(run_id, REUSED_FROM_RUN_TAG.format(role=role), produced_by)
    client.set_tag(run_id, REUSED_VERSION_TAG.format(role=role), str(version))


def champion_before_run(
    tracking_uri: str, name: str, pipeline_run: str | None = None, version: str | None = None
) -> str | None:
    """The champion version of ``name`` as a run first found it. Where a killed attempt of the
    same run already moved ``champion`` to its own model (the one ``pipeline_run`` registered,
    or ``version`` itself), the version that one replaced (its ``champion.previous``): the rerun
    evaluates and decides against what the run first judged against, not against itself."""
    from alignflow.registry import models as registry_models
    from alignflow.registry.decision_tags import PREVIOUS_CHAMPION_TAG

    current = registry_models.version_by_alias(tracking_uri, name, registry_models.CHAMPION)
    if current is None:
        return None
    own = str(current.version) == version or (
        pipeline_run is not None and producing_pipeline_run(tracking_uri, current) == pipeline_run
    )
    if not own:
        return str(current.version)
    return (current.tags or {}).get(PREVIOUS_CHAMPION_TAG) or None


def champion_copy(
    tracking_uri: str, project: str, out_root: Path, role: str = "policy", pipeline_run: str | None = None
) -> tuple[str | None, str]:
    """A local copy of ``role``'s champion and its version ("" when there is none); given the
    ``pipeline_run`` asking, the champion as that run first found it (:func:`champion_before_run`)."""
    from alignflow.registry import models as registry_models

    name = registry_models.registered_name(project, role)
    version = champion_before_run(tracking_uri, name, pipeline_run)
    if version is None:
        return None, ""
    target = out_root / f"champion-{role}-v{version}"
    path = target if (target / "config.json").exists() else None
    path = path or registry_models.download_model_dir(tracking_uri, name, version, target)
    return (str(path) if path else None), version
