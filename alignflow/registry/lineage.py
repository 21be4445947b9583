"""Where a registered model came from, read back from the registry and the runs behind it.

A version registered by the pipeline carries lineage tags (data version, config hash, git
commit) and points at its stage run, whose parent run holds the pipeline's summary. From
these the flow decides whether a run has anything to do, shows the champion's stages as
cache hits, and fetches the champion to compare a challenger with.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mlflow is imported only when the registry is read (the CLI stays quick)
    from mlflow.entities.model_registry import ModelVersion

PARENT_RUN_TAG = "mlflow.parentRunId"
SUMMARY_ARTIFACT = "summary.json"  # the pipeline's summary on its parent run


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


def pipeline_summary(tracking_uri: str, version: ModelVersion) -> dict[str, Any] | None:
    """The summary of the pipeline run that trained ``version``; None for one registered by hand."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if not version.run_id:
        return None
    try:
        stage_run = MlflowClient(tracking_uri).get_run(version.run_id)
        parent_id = stage_run.data.tags[PARENT_RUN_TAG]
        mlflow.set_tracking_uri(tracking_uri)
        return mlflow.artifacts.load_dict(f"runs:/{parent_id}/{SUMMARY_ARTIFACT}")
    except (KeyError, OSError, MlflowException):
        return None  # not a pipeline run (or it is gone)


def champion_copy(
    tracking_uri: str, project: str, out_root: Path, role: str = "policy"
) -> tuple[str | None, str]:
    """A local copy of the current champion of ``role`` and its version ("" when there is none)."""
    from alignflow.registry import models as registry_models

    name = registry_models.registered_name(project, role)
    version = registry_models.alias_version(tracking_uri, name, registry_models.CHAMPION)
    if version is None:
        return None, ""
    target = out_root / f"champion-{role}-v{version}"
    path = target if (target / "config.json").exists() else None
    path = path or registry_models.download_model_dir(tracking_uri, name, version, target)
    return (str(path) if path else None), version
