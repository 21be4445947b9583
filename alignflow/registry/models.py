"""Logging models to MLflow and managing registry aliases.

Policies are logged as alignflow's policy pyfunc (:mod:`alignflow.registry.policy_pyfunc`):
MLflow's text-generation pipeline would echo the prompt and skip the chat template the
evaluation answered through. Reward models are logged as alignflow's reward pyfunc
(:mod:`alignflow.registry.reward_pyfunc`): the transformers pipeline would ignore their
pooling and normalisation. A quantized LoRA classifier (an adapter with no ``config.json``
of its own) keeps the transformers flavour.

Registered names follow ``<project>-policy`` and ``<project>-reward``. Only aliases are
used (``challenger`` for the newest candidate, ``champion`` for the one to serve); stages
are deprecated in MLflow and never touched here. Every function takes the tracking URI
explicitly so that nothing depends on a process-global default.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from alignflow.kill_points import kill_point
from alignflow.logs import logger_level
from alignflow.registry import policy_pyfunc, reward_pyfunc

if TYPE_CHECKING:
    from alignflow.evaluation.config import EvaluationConfig

CHALLENGER = "challenger"
CHAMPION = "champion"
BASE_MODEL_TAG = "base_model"
BASE_WEIGHTS_TAG = "base_model.sha256"  # a real base model's weights, as pulled; none for one built offline
MODEL_KIND_TAG = "alignflow.kind"
ROLES = ("policy", "reward")
SIDECAR_GLOB = "alignflow_*.json"  # what alignflow saves beside weights (the reward model's meta)
SIDECARS_KEY = "alignflow.sidecars"


def registered_name(project: str, role: str) -> str:
    """``<project>-policy`` or ``<project>-reward``."""
    if role not in ROLES:
        raise ValueError(f"model role must be one of {ROLES}, got {role!r}")
    return f"{project}-{role}"


@dataclass(frozen=True)
class LoggedVersion:
    """What a logged and registered model left behind: small, hashable, passable between tasks."""

    name: str
    version: str
    model_uri: str
    run_id: str


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def is_peft_adapter(model_dir: str | Path) -> bool:
    return (Path(model_dir) / "adapter_config.json").exists()


def base_model_reference(model_dir: str | Path) -> str | None:
    """The base model a PEFT adapter was trained on (path or hub id), None for a full model."""
    return _read_json(Path(model_dir) / "adapter_config.json").get("base_model_name_or_path")


def infer_task(model_dir: str | Path) -> str:
    """The transformers pipeline task of a saved model: classifiers score, the rest generate."""
    model_dir = Path(model_dir)
    adapter = _read_json(model_dir / "adapter_config.json")
    if adapter:
        return "text-classification" if adapter.get("task_type") == "SEQ_CLS" else "text-generation"
    architectures = _read_json(model_dir / "config.json").get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "text-classification"
    return "text-generation"


def _load_components(model_dir: Path, task: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    loader: Any  # a peft or a transformers auto class: each has from_pretrained
    if is_peft_adapter(model_dir):
        from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification

        loader = (
            AutoPeftModelForSequenceClassification
            if task == "text-classification"
            else AutoPeftModelForCausalLM
        )
    else:
        loader = AutoModelForSequenceClassification if task == "text-classification" else AutoModelForCausalLM
    model = loader.from_pretrained(str(model_dir))
    return {"model": model, "tokenizer": AutoTokenizer.from_pretrained(str(model_dir))}


def _pip_requirements() -> list[str]:
    """Pinned requirements given up front: MLflow's inference imports optional packages
    (torchvision) that a CPU install does not have."""
    from importlib.metadata import version

    return [f"{pkg}=={version(pkg).split('+')[0]}" for pkg in ("torch", "transformers", "tokenizers")]


def log_model(
    model_dir: str | Path,
    tracking_uri: str,
    registered_model_name: str | None = None,
    name: str = "model",
    tags: Mapping[str, Any] | None = None,
    evaluation: EvaluationConfig | None = None,
    dtype: str | None = None,
) -> LoggedVersion | None:
    """Log a saved model directory to the active run (policy or reward pyfunc; a LoRA
    classifier in the transformers flavour).

    A PEFT adapter is logged as an adapter with its base model recorded (``base_model``
    tag and model metadata), not as a merged copy of the base weights; the policy pyfunc loads
    base + adapter and folds them, as evaluation does. ``evaluation`` and ``dtype``: how the
    run's evaluation generated (the policy's serving defaults; see
    :func:`~alignflow.registry.policy_pyfunc.log_policy_model`). When
    ``registered_model_name`` is given the model is also registered, the new version is
    tagged (lineage, base model) and receives the ``challenger`` alias.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists() and not is_peft_adapter(model_dir):
        raise FileNotFoundError(f"{model_dir}: not a saved transformers model (no config.json)")
    mlflow.set_tracking_uri(tracking_uri)
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("log_model needs an active MLflow run (start a stage run first)")
    task = infer_task(model_dir)
    base = base_model_reference(model_dir)
    metadata = {
        "alignflow.source_dir": str(model_dir),
        **({BASE_MODEL_TAG: base} if base else {}),
        **({SIDECARS_KEY: sidecars} if (sidecars := read_sidecars(model_dir)) else {}),
    }
    if task == "text-classification" and (model_dir / "config.json").exists():
        info = reward_pyfunc.log_reward_model(model_dir, name, metadata, _pip_requirements())
    elif task == "text-generation":
        info = policy_pyfunc.log_policy_model(
            model_dir, name, metadata, _pip_requirements(), evaluation, dtype, registered_model_name
        )
    else:
        # a model built offline has no hub card or licence; MLflow warns about both, every time
        with logger_level("mlflow.transformers", logging.ERROR):
            info = mlflow.transformers.log_model(
                _load_components(model_dir, task),
                name=name,
                task=task,
                pip_requirements=_pip_requirements(),
                metadata=metadata,
            )
    if registered_model_name is None:
        return None
    version_tags = {**(tags or {}), MODEL_KIND_TAG: task, **({BASE_MODEL_TAG: base} if base else {})}
    kill_point("register.logged")
    return register(tracking_uri, info.model_uri, registered_model_name, run.info.run_id, version_tags)


def logged_model_id(model_uri: str) -> str | None:
    """MLflow 3's ``models:/m-<id>`` URIs name a logged model; a REST server requires its id."""
    match = re.fullmatch(r"models:/(m-[0-9a-f]+)", model_uri)
    return match.group(1) if match else None


def register(
    tracking_uri: str,
    model_uri: str,
    registered_model_name: str,
    run_id: str | None = None,
    tags: Mapping[str, Any] | None = None,
) -> LoggedVersion:
    """Register ``model_uri`` as a new version and make it the ``challenger``."""
    client = MlflowClient(tracking_uri)
    try:
        client.get_registered_model(registered_model_name)
    except MlflowException:
        client.create_registered_model(registered_model_name)
    version = client.create_model_version(
        registered_model_name,
        source=model_uri,
        run_id=run_id,
        tags={k: str(v) for k, v in (tags or {}).items()},
        model_id=logged_model_id(model_uri),
    )
    kill_point("register.versioned")
    client.set_registered_model_alias(registered_model_name, CHALLENGER, version.version)
    return LoggedVersion(registered_model_name, str(version.version), model_uri, run_id or "")


def version_by_alias(tracking_uri: str, name: str, alias: str) -> ModelVersion | None:
    """The version holding ``alias``, or None when the alias (or the model) does not exist."""
    try:
        return MlflowClient(tracking_uri).get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def alias_version(tracking_uri: str, name: str, alias: str) -> str | None:
    """The version number (as a string, whatever the store returns) holding ``alias``."""
    version = version_by_alias(tracking_uri, name, alias)
    return None if version is None else str(version.version)


def version_uri(tracking_uri: str, name: str, alias_or_version: str) -> str | None:
    """``models:/NAME/N`` or ``models:/NAME@ALIAS``; None when that alias does not exist."""
    if alias_or_version.isdigit():
        return f"models:/{name}/{alias_or_version}"
    if version_by_alias(tracking_uri, name, alias_or_version) is None:
        return None
    return f"models:/{name}@{alias_or_version}"


def load_components(tracking_uri: str, name: str, alias_or_version: str) -> dict[str, Any] | None:
    """Model and tokenizer of a registered version (by alias or number); None when absent.

    Used by evaluation to compare a challenger with the current champion.
    """
    uri = version_uri(tracking_uri, name, alias_or_version)
    if uri is None:
        return None
    mlflow.set_tracking_uri(tracking_uri)
    saved = saved_dir_path(mlflow.models.get_model_info(uri).flavors)
    if saved is None:
        return mlflow.transformers.load_model(uri, return_type="components")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = download_saved_dir(uri, saved, Path(scratch) / "model")
        return _load_components(model_dir, infer_task(model_dir))


def download_model_dir(tracking_uri: str, name: str, alias_or_version: str, dst: str | Path) -> Path | None:
    """A local directory with the saved weights + tokenizer of a registered version, or None.

    Stages that take model *paths* (TRL's trainers, the reward scorer) load from here; the
    sidecar files saved with the model (a reward model's normalisation and pooling) come back
    beside the weights.
    """
    uri = version_uri(tracking_uri, name, alias_or_version)
    if uri is None:
        return None
    mlflow.set_tracking_uri(tracking_uri)
    dst = Path(dst)
    info = mlflow.models.get_model_info(uri)
    if (saved := saved_dir_path(info.flavors)) is not None:
        return download_saved_dir(uri, saved, dst)
    components = mlflow.transformers.load_model(uri, return_type="components")
    dst.mkdir(parents=True, exist_ok=True)
    components["model"].save_pretrained(dst, safe_serialization=True)
    components["tokenizer"].save_pretrained(dst)
    for filename, content in ((info.metadata or {}).get(SIDECARS_KEY) or {}).items():
        (dst / filename).write_text(json.dumps(content, indent=2), encoding="utf-8")
    return dst


def saved_dir_path(flavors: dict[str, Any]) -> str | None:
    """Where a logged policy or reward pyfunc keeps the saved model directory (from its MLmodel
    flavours); None for a model in MLflow's transformers flavour (versions logged before the
    policy pyfunc, LoRA classifiers)."""
    if "transformers" in flavors:
        return None
    artifacts = (flavors.get("python_function") or {}).get("artifacts") or {}
    saved = artifacts.get(reward_pyfunc.ARTIFACT) or artifacts.get(policy_pyfunc.ARTIFACT) or {}
    return saved.get("path")


def download_saved_dir(model_uri: str, artifact_path: str, dst: Path) -> Path:
    """Only the saved model directory of a logged pyfunc, placed at ``dst``.

    It is fetched beside ``dst`` and moved in, so a local store's weights are copied once.
    """
    dst.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent) as scratch:
        local = Path(
            mlflow.artifacts.download_artifacts(artifact_uri=f"{model_uri}/{artifact_path}", dst_path=scratch)
        )
        if not (local / "config.json").exists() and not is_peft_adapter(local):
            raise FileNotFoundError(f"{model_uri}: no saved model at {artifact_path}")
        for item in local.iterdir():
            item.replace(dst / item.name)
    return dst


def read_sidecars(model_dir: Path) -> dict[str, Any]:
    """The ``alignflow_*.json`` files beside a model's weights, by name (logged in its metadata)."""
    return {path.name: _read_json(path) for path in sorted(model_dir.glob(SIDECAR_GLOB))}
