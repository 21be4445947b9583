"""Rebuilding a registered version from its lineage, and whether it comes out the same.

A version records what made it: the data version (DVC md5), the config hash, the alignflow code
that ran (``code.digest``), the workspace's commit and, for a real base model, its weights'
sha256; the pipeline run that registered it holds the whole config (``config.json``: seed and
``deterministic`` settings included). :func:`read_lineage` reads those back and refuses, naming
the piece, when one is missing; :func:`replay_config` turns them into a config for a scratch
workspace; :func:`compare` says whether the rebuilt weights are the registered ones, bit for bit.
Running the pipeline between the two is the caller's (``alignflow replay``): this module only
reads the store and files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from alignflow.code_version import UNKNOWN, package_digest
from alignflow.errors import InputError
from alignflow.registry.models import BASE_WEIGHTS_TAG
from alignflow.registry.pipeline_record import CONFIG_ARTIFACT
from alignflow.registry.runs import CODE_DIGEST_TAG, CONFIG_HASH_TAG, DATA_VERSION_TAG, GIT_COMMIT_TAG

# what a replay cannot do without, as a user would name it
NEEDED_TAGS = {
    DATA_VERSION_TAG: "the data version (tag data.version)",
    CONFIG_HASH_TAG: "the config hash (tag config.hash)",
    CODE_DIGEST_TAG: "the alignflow code it ran (tag code.digest)",
}
# config values that place a run's files: the replay's own go in its scratch workspace
SCRATCH_PLACES = {
    ("output_dir",),
    ("data", "data_dir"),
    ("tracking", "uri"),
    ("tracking", "artifact_location"),
    ("evaluation", "golden_dir"),  # copied into the scratch workspace: DVC tracks it there
}


class LineageIncomplete(InputError):
    """A version whose lineage lacks what a replay needs; the message names each missing piece."""


@dataclass
class Lineage:
    """What a registered version says made it."""

    name: str
    version: str
    pipeline_run: str
    config: dict[str, Any]
    data_version: str
    config_hash: str
    code_digest: str
    git_commit: str
    base_weights: str | None
    weights_sha256: str


@dataclass
class ReplayReport:
    """A replay's outcome: the registered weights against the rebuilt ones, and why they may differ."""

    lineage: Lineage
    replayed_weights: str | None
    replayed_data_version: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return self.replayed_weights == self.lineage.weights_sha256

    def to_dict(self) -> dict[str, Any]:
        lineage = {k: v for k, v in asdict(self.lineage).items() if k != "config"}
        return {
            **lineage,
            "replayed_weights": self.replayed_weights,
            "replayed_data_version": self.replayed_data_version,
            "matches": self.matches,
            "notes": self.notes,
        }


def weights_sha256(folder: str | Path) -> str:
    """sha256 over a model folder's safetensors files (relative names and bytes, in order)."""
    root = Path(folder)
    files = sorted(root.rglob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root}: no safetensors files")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def registered_weights_sha256(tracking_uri: str, name: str, version: str) -> str:
    """:func:`weights_sha256` of a registered version's artifacts, downloaded from the store."""
    import mlflow
    from mlflow import MlflowClient

    # the version's own artifact location: a models:/ URI would be looked up in the process's
    # default registry, not in ``tracking_uri``
    location = MlflowClient(tracking_uri).get_model_version_download_uri(name, version)
    with tempfile.TemporaryDirectory() as tmp:
        folder = mlflow.artifacts.download_artifacts(location, dst_path=tmp, tracking_uri=tracking_uri)
        return weights_sha256(folder)


def _logged_config(tracking_uri: str, pipeline_run: str) -> dict[str, Any] | None:
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = mlflow.artifacts.download_artifacts(
                run_id=pipeline_run, artifact_path=CONFIG_ARTIFACT, dst_path=tmp, tracking_uri=tracking_uri
            )
            return json.loads(Path(path).read_text(encoding="utf-8"))
    except (MlflowException, OSError):
        return None


def read_lineage(tracking_uri: str, name: str, version: str) -> Lineage:
    """The lineage of ``name`` version ``version``; :class:`LineageIncomplete` naming every
    piece it lacks (a version registered by hand has no pipeline run at all)."""
    from mlflow import MlflowClient

    from alignflow.registry.lineage import producing_pipeline_run

    found = MlflowClient(tracking_uri).get_model_version(name, version)
    tags = found.tags or {}
    ref = f"models:/{name}/{version}"
    missing = [what for tag, what in NEEDED_TAGS.items() if tags.get(tag, UNKNOWN) == UNKNOWN]
    pipeline_run = producing_pipeline_run(tracking_uri, found)
    if pipeline_run is None:
        missing.append("the pipeline run that trained it (registered by hand, or its run deleted)")
        config = None
    else:
        config = _logged_config(tracking_uri, pipeline_run)
        if config is None:
            missing.append(f"the run's whole config ({CONFIG_ARTIFACT} on pipeline run {pipeline_run})")
    if missing:
        raise LineageIncomplete(f"{ref} cannot be replayed: its lineage lacks {'; '.join(missing)}")
    assert config is not None and pipeline_run is not None
    return Lineage(
        name=name,
        version=str(version),
        pipeline_run=pipeline_run,
        config=config,
        data_version=tags[DATA_VERSION_TAG],
        config_hash=tags[CONFIG_HASH_TAG],
        code_digest=tags[CODE_DIGEST_TAG],
        git_commit=tags.get(GIT_COMMIT_TAG, UNKNOWN),
        base_weights=tags.get(BASE_WEIGHTS_TAG),
        weights_sha256=registered_weights_sha256(tracking_uri, name, str(version)),
    )


def config_matches_hash(lineage: Lineage, tracking_uri: str) -> bool:
    """Whether the logged config is the one the version's ``config.hash`` names. The log leaves
    out the tracking URI (it may hold a password): tried as unset and as the store's URI."""
    from alignflow.config import PipelineConfig, config_hash

    for uri in (None, tracking_uri):
        config = dict(lineage.config)
        config["tracking"] = {**config.get("tracking", {}), "uri": uri}
        if config_hash(PipelineConfig.model_validate(config)) == lineage.config_hash:
            return True
    return False


def _absolute_paths(value: Any, where: tuple[str, ...], base: Path) -> Any:
    """Relative paths that exist under ``base`` made absolute: the replay runs elsewhere."""
    if where in SCRATCH_PLACES:
        return value
    if isinstance(value, dict):
        return {k: _absolute_paths(v, (*where, k), base) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute_paths(v, where, base) for v in value]
    if isinstance(value, str) and value and not Path(value).is_absolute() and "://" not in value:
        candidate = base / value
        if candidate.exists():
            return str(candidate.resolve())
    return value


def replay_config(lineage: Lineage, scratch: Path, work_dir: Path) -> dict[str, Any]:
    """The version's config for a run in ``scratch``: its own store, data folder and outputs
    there; files it read (the data source, a pinned set) found from ``work_dir`` as before."""
    config = _absolute_paths(lineage.config, (), work_dir)
    config["output_dir"] = str(scratch / "outputs")
    config["data"] = {**config.get("data", {}), "data_dir": str(scratch / "data")}
    config["tracking"] = {**config.get("tracking", {}), "uri": f"sqlite:///{scratch / 'mlflow.db'}"}
    config["tracking"].pop("artifact_location", None)
    return config


def copy_pinned_set(lineage: Lineage, scratch: Path, work_dir: Path) -> None:
    """The pinned evaluation set the run judged on (a relative ``golden_dir`` and its DVC
    pointer), copied into ``scratch``: DVC tracks it inside the replay's workspace, and a set
    frozen from an earlier data version is not the one the replay's data would freeze."""
    golden = lineage.config.get("evaluation", {}).get("golden_dir") or "golden"
    if Path(golden).is_absolute() or not (work_dir / golden).is_dir():
        return
    shutil.copytree(work_dir / golden, scratch / golden, dirs_exist_ok=True)
    pointer = work_dir / f"{golden}.dvc"
    if pointer.exists():
        shutil.copy2(pointer, scratch / pointer.name)


def differences_here(lineage: Lineage) -> list[str]:
    """What differs between the version's making and this machine, before anything runs."""
    from alignflow.models.real_models import base_weights_sha256

    notes = []
    if lineage.code_digest != package_digest():
        notes.append(
            f"the alignflow code differs (version: {lineage.code_digest}, here: {package_digest()}; "
            f"its workspace commit: {lineage.git_commit}): the weights may differ for that alone"
        )
    model = lineage.config.get("model", {}).get("name")
    if lineage.base_weights and model and base_weights_sha256(model) != lineage.base_weights:
        notes.append(f"the base model {model}'s weights differ from the ones the version started from")
    return notes


def compare(lineage: Lineage, replayed_weights: str | None, replayed_data: str | None) -> ReplayReport:
    """The report on a replay: ``replayed_weights`` is :func:`registered_weights_sha256` of the
    version the replay registered under the same name (None: it registered none)."""
    notes = []
    if replayed_data != lineage.data_version:
        notes.append(
            f"the data differs: the source now gives version {replayed_data}, "
            f"the version was trained on {lineage.data_version}"
        )
    if replayed_weights is None:
        notes.append(f"the replay registered no {lineage.name}")
    return ReplayReport(lineage, replayed_weights, replayed_data, notes)
