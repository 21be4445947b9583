"""The pinned evaluation set: prompts (with answers where verifiable) and pairs that stay put.

A challenger judged only on its own data version's eval split is judged by the data that
made it: poison the data and the yardstick moves with it. The golden set is frozen once,
from the first data version's eval split, kept in ``golden/`` beside ``data/`` and tracked
by DVC (``golden.dvc``), so every later challenger and champion are compared on the same
rows. A user can point ``evaluation.golden`` at a file instead (read and validated like
any input). Either way its md5 is the golden version, tagged on every evaluated model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alignflow.data import versioning
from alignflow.data.snapshot import load_split, write_split
from alignflow.data.split import prompt_key
from alignflow.errors import InputError
from alignflow.evaluation.config import EvaluationConfig
from alignflow.logs import logger_level

GOLDEN_SPLIT = "golden"
GOLDEN_INFO = "golden.json"


class GoldenSetError(InputError):
    """The pinned set cannot be used (unreadable file, bad rows, nothing to judge on)."""


@dataclass(frozen=True)
class GoldenSet:
    """Where the pinned rows are and what they hold; ``version`` is their md5."""

    path: str
    version: str
    source: str
    prompts: int
    answers: int
    pairs: int

    def records(self) -> list[dict[str, Any]]:
        return load_golden_records(self.path)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_golden_records(path: str | Path) -> list[dict[str, Any]]:
    """Canonical records of a pinned set: a frozen ``golden/`` folder or a validated user file."""
    path = Path(path)
    if path.is_dir() and (path / f"{GOLDEN_SPLIT}.parquet").exists():
        return load_split(path, GOLDEN_SPLIT)
    return _validated_file_records(path)


def _validated_file_records(path: Path) -> list[dict[str, Any]]:
    from alignflow.data.config import DataConfig
    from alignflow.data.validation import validate_paths

    if not path.exists():
        raise GoldenSetError(f"{path}: evaluation.golden does not exist")
    validated = validate_paths(path, DataConfig(source=str(path), max_bad_fraction=1.0))
    if validated.issues:
        raise GoldenSetError(
            f"{path}: {len(validated.issues)} pinned row(s) fail validation; the first: "
            f"{validated.issues[0].describe()}"
        )
    return [entry.record for entry in validated.kept]


def existing_pinned_records(config: EvaluationConfig, repo_dir: str | Path) -> list[dict[str, Any]] | None:
    """The pinned rows a run will be judged on, when they exist before its data is versioned
    (a configured file, or ``golden/`` as checked out); None before the first freeze."""
    repo_dir = Path(repo_dir).resolve()
    if config.golden:
        path = Path(config.golden)
        path = path if path.is_absolute() else repo_dir / path
        return _validated_file_records(path) if path.exists() else None
    folder = repo_dir / config.golden_dir
    return load_split(folder, GOLDEN_SPLIT) if (folder / f"{GOLDEN_SPLIT}.parquet").exists() else None


def _counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """Distinct prompts, distinct prompts with a reference answer, and labelled pairs."""
    from alignflow.evaluation.metrics import preference_pairs

    prompts = {prompt_key(r["prompt"]) for r in records if r.get("prompt") is not None}
    answers = {
        prompt_key(r["prompt"]) for r in records if (r.get("metadata") or {}).get("answer") is not None
    }
    return {"prompts": len(prompts), "answers": len(answers), "pairs": len(preference_pairs(records))}


def _file_md5(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def pin_golden_set(
    config: EvaluationConfig, snapshot_dir: str | Path, repo_dir: str | Path, remote: str | None = None
) -> GoldenSet:
    """The pinned set for this run: the configured file, else ``golden/`` (frozen on first use)."""
    repo_dir = Path(repo_dir).resolve()
    if config.golden:
        path = Path(config.golden)
        path = path if path.is_absolute() else repo_dir / path
        counts = _counts(_validated_file_records(path))  # validated first: it names a missing file
        return _golden(path, _file_md5(path), f"file {path}", counts)
    golden_dir = repo_dir / config.golden_dir
    version = versioning.current_version(repo_dir, config.golden_dir)
    if version is not None and not (golden_dir / f"{GOLDEN_SPLIT}.parquet").exists():
        # tracked but not checked out (a fresh clone)
        _restore(repo_dir, config.golden_dir, version, snapshot_dir, remote)
    if version is None:
        return freeze_golden_set(snapshot_dir, repo_dir, config.golden_dir, remote)
    info = json.loads((golden_dir / GOLDEN_INFO).read_text(encoding="utf-8"))  # written when frozen
    counts = {k: info[k] for k in ("prompts", "answers", "pairs")}
    return _golden(golden_dir, version, info["source"], counts)


def _restore(
    repo_dir: Path, golden_dir: str, version: str, snapshot_dir: str | Path, remote: str | None
) -> None:
    """Bring back the tracked pinned set: from DVC, else rebuilt from this snapshot if that gives
    the very same md5 (a fresh clone of a repo whose first data version is rebuilt, like the demo).

    Never anything else: a different set would silently move the yardstick.
    """
    try:
        # a missing cache is expected here (a fresh clone) and handled below: keep DVC's warnings quiet
        with logger_level("dvc", logging.ERROR), logger_level("dvc_data", logging.ERROR):
            versioning.pull(repo_dir, golden_dir)
        return
    except Exception as exc:  # DVC raises many kinds: a missing remote, a missing cache entry, ...
        why = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())
    dvc_path = versioning.dvc_file(repo_dir, golden_dir)
    pinned = dvc_path.read_text(encoding="utf-8")
    if freeze_golden_set(snapshot_dir, repo_dir, golden_dir, remote).version == version:
        return
    dvc_path.write_text(pinned, encoding="utf-8")
    shutil.rmtree(repo_dir / golden_dir, ignore_errors=True)
    raise GoldenSetError(
        f"{dvc_path} pins evaluation set {version}, but it cannot be restored ({why}) and this data "
        f"version's eval split is another set; fetch it with `dvc pull {dvc_path.name}`, or delete "
        f"{dvc_path.name} to freeze a new pinned set (champions judged on the old one are then compared "
        "on new rows)"
    )


def freeze_golden_set(
    snapshot_dir: str | Path, repo_dir: str | Path, golden_dir: str = "golden", remote: str | None = None
) -> GoldenSet:
    """Copy a snapshot's eval split into ``golden/`` and ``dvc add`` it: the set every later run uses."""
    repo_dir = Path(repo_dir).resolve()
    records = load_split(snapshot_dir, "eval")
    if not records:
        raise GoldenSetError(f"{snapshot_dir}: the eval split is empty, nothing to pin")
    target = repo_dir / golden_dir
    target.mkdir(parents=True, exist_ok=True)
    write_split(target, GOLDEN_SPLIT, records)
    source_version = versioning.current_version(repo_dir, Path(snapshot_dir).name) or "unknown"
    source = f"eval split of data version {source_version}"
    counts = _counts(records)
    info = {"source": source, **counts}
    (target / GOLDEN_INFO).write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
    versioning.ensure_repo(repo_dir, remote)
    version = versioning.track(repo_dir, golden_dir)
    versioning.push(repo_dir, golden_dir)
    return _golden(target, version, source, counts)


def _golden(path: Path, version: str, source: str, counts: dict[str, int]) -> GoldenSet:
    if not counts["prompts"]:
        raise GoldenSetError(f"{path}: the pinned set has no prompts to judge on")
    return GoldenSet(str(path), version, source, **counts)
