"""Evaluations of registered models: resolving ``models:/NAME@ALIAS`` for ``alignflow eval`` and
logging a benchmark report as an evaluation run linked to the version's logged model (MLflow 3),
so the registry shows how each version did on each benchmark.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alignflow.evaluation.benchmark import Benchmark, benchmark_info
from alignflow.registry.models import download_model_dir
from alignflow.registry.names import UnknownModelError, require_registered
from alignflow.registry.runs import ensure_experiment
from alignflow.registry.tracking import sanitize_name

_REGISTERED = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the Hub spells repositories


@dataclass(frozen=True)
class ModelRef:
    """A model named on the command line: a local folder or a registered version."""

    ref: str
    path: str
    name: str | None = None
    version: str | None = None
    model_id: str | None = None

    @property
    def registered(self) -> bool:
        return self.name is not None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_registered(ref: str) -> tuple[str, str] | None:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> (name, alias or version); else None."""
    match = _REGISTERED.fullmatch(ref)
    if match is None:
        if ref.startswith("models:/"):
            raise ValueError(f"{ref!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
        return None
    return match["name"], match["alias"] or match["version"]


def _why_not_a_folder(path: Path) -> str:
    if path.is_dir():
        return "not a saved model folder (no config.json)"
    if _HUB_ID.fullmatch(str(path)):  # e.g. OpenAssistant/reward-model-deberta-v3-large-v2
        return (
            "no such folder; alignflow reads models offline, so a Hugging Face Hub id must be "
            f"downloaded first (huggingface-cli download {path} --local-dir DIR) and DIR given"
        )
    return "no such folder"


def _missing_version(client: Any, name: str, which: str, tracking_uri: str) -> str:
    """The model exists but not that version or alias: say which ones it has."""
    aliases = client.get_registered_model(name).aliases or {}
    held = ", ".join(f"@{alias} (version {v})" for alias, v in sorted(aliases.items())) or "none"
    what = f"version {which}" if which.isdigit() else f"alias @{which}"
    return f"{name} has no {what} in {tracking_uri}; its aliases: {held}"


def registered_version(tracking_uri: str, ref: str, name: str, which: str) -> Any:
    """The version ``ref`` names; FileNotFoundError saying which names, or aliases, do exist."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        require_registered(tracking_uri, name)
    except UnknownModelError as exc:
        raise FileNotFoundError(f"{ref}: {exc}") from None
    client = MlflowClient(tracking_uri)
    try:
        if which.isdigit():
            return client.get_model_version(name, which)
        return client.get_model_version_by_alias(name, which)
    except MlflowException as exc:
        raise FileNotFoundError(f"{ref}: {_missing_version(client, name, which, tracking_uri)}") from exc


def resolve_model(ref: str, tracking_uri: str | None, work_dir: str | Path) -> ModelRef:
    """A local folder as it is; a registered version downloaded under ``work_dir``.

    Raises FileNotFoundError when the folder or the version does not exist.
    """
    registered = parse_registered(ref)
    if registered is None:
        from alignflow.models.real_models import real_model_source

        real = real_model_source(ref)  # a real model's name or a .gguf: its converted folder
        if real is not None:
            return ModelRef(ref, real)
        path = Path(ref).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{ref}: {_why_not_a_folder(path)}")
        return ModelRef(ref, str(path))
    if tracking_uri is None:
        raise ValueError(
            f"{ref}: a registered model needs a tracking URI (--tracking-uri or MLFLOW_TRACKING_URI)"
        )
    name, which = registered
    version = registered_version(tracking_uri, ref, name, which)
    target = Path(work_dir) / f"{name}-v{version.version}"
    downloaded = download_model_dir(tracking_uri, name, str(version.version), target)
    if downloaded is None:
        raise FileNotFoundError(f"{ref}: version {version.version} could not be loaded")
    return ModelRef(ref, str(downloaded), name, str(version.version), logged_model_id(version))


def logged_model_id(version: Any) -> str | None:
    """The logged model (MLflow 3) behind a registered version: its ``model_id`` where the
    registry stores it, else the ``models:/m-<id>`` source it was registered from (the
    SQL store keeps only the source)."""
    if getattr(version, "model_id", None):
        return version.model_id
    match = re.fullmatch(r"models:/(m-[0-9a-f]+)", version.source or "")
    return match.group(1) if match else None


def benchmark_dataset(benchmark: Benchmark):
    """The benchmark as an MLflow dataset (name, digest of the file, where it lives)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # MLflow registers two equivalent sources for local paths
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(Path(benchmark.path).resolve()))
    sha = benchmark_info(benchmark)["sha256"] or ""
    # MLflow marks Dataset.profile abstract, but Dataset is no ABC: MetaDataset is usable as it is
    return MetaDataset(source, name=benchmark.name, digest=(sha[:16] or None))  # type: ignore[abstract]


def _experiment_of(client: Any, model: ModelRef) -> str | None:
    """The experiment the version was trained in, so its evaluations sit beside it."""
    if model.model_id:
        return client.get_logged_model(model.model_id).experiment_id
    run_id = client.get_model_version(model.name, model.version).run_id
    return client.get_run(run_id).info.experiment_id if run_id else None


def log_benchmark_run(
    tracking_uri: str,
    report: Mapping[str, Any],
    model: ModelRef,
    benchmark: Benchmark,
    files: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Log the report as an evaluation run of a registered version.

    The metrics are logged against the version's logged model (``model_id``) and the
    benchmark dataset, under keys ``<benchmark>/<metric>``, so the logged model lists how it
    did on every benchmark it met. The version gets an ``eval.<benchmark>.run_id`` tag.
    """
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    experiment_id = _experiment_of(client, model)
    if experiment_id is None:
        # by id, not mlflow.set_experiment: a library call leaves the process's active experiment alone
        experiment_id = ensure_experiment(tracking_uri, f"{model.name}-eval")
    bench = sanitize_name(benchmark.name).replace("/", "_")
    metrics = {
        sanitize_name(f"{bench}/{k}"): float(v)
        for k, v in report["metrics"].items()
        if v is not None and np.isfinite(v)
    }
    tags = {
        "alignflow.eval.kind": report["kind"],
        "alignflow.eval.benchmark": benchmark.name,
        "alignflow.eval.model": f"{model.name}/{model.version}",
    }
    with mlflow.start_run(
        experiment_id=experiment_id, run_name=f"eval-{report['kind']}-{bench}", tags=tags
    ) as run:
        info = benchmark_info(benchmark)
        mlflow.log_params(
            {f"benchmark.{k}": str(v)[:500] for k, v in info.items()} | {"model.version": model.version}
        )
        mlflow.log_metrics(metrics, model_id=model.model_id, dataset=benchmark_dataset(benchmark))
        for path in (files or {}).values():
            mlflow.log_artifact(str(path), f"eval/{bench}")
    assert model.name is not None  # a registered version: the only kind logged here
    client.set_model_version_tag(model.name, model.version, f"eval.{bench}.run_id", run.info.run_id)
    return {
        "tracking_uri": tracking_uri,
        "run_id": run.info.run_id,
        "experiment_id": experiment_id,
        "model_id": model.model_id,
        "metric_prefix": f"{bench}/",
    }
