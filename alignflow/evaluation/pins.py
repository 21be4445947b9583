"""The DVC pointers a workspace commits (``data.dvc``, ``golden.dvc``): can they be restored?

A clone holds the pointers but not the folders they pin. A folder comes back from the DVC
cache, from the remote, or, for the built-in demo, by running the demo's data stage again:
its input is written deterministically, so the snapshot and the pinned set it freezes have
the same md5 in every clone. That last way holds only while the data stage writes the same
bytes; a change that moves them must refresh the committed pointers (``make pins``), or
every fresh clone stops at its first run. ``expected_demo_pins`` runs that data stage in a
scratch repo so that a test and ``alignflow doctor`` can tell.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from alignflow.data import versioning
from alignflow.data.config import DataConfig
from alignflow.evaluation.config import EvaluationConfig

REFRESH_COMMAND = "make pins"


@dataclass(frozen=True)
class Pin:
    """One ``.dvc`` pointer: the file and what it pins (md5, size, file count)."""

    file: str
    md5: str | None
    size: int | None = None
    nfiles: int | None = None

    @classmethod
    def read(cls, path: Path) -> Pin:
        outs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("outs") or [{}]
        return cls(path.name, outs[0].get("md5"), outs[0].get("size"), outs[0].get("nfiles"))


@dataclass(frozen=True)
class PinStatus:
    """Whether one pointer can be restored in this workspace, how, and the fix when it cannot."""

    file: str
    ok: bool
    detail: str
    fix: str = ""


def pinned_folders(data: DataConfig, evaluation: EvaluationConfig) -> list[str]:
    """The folders a run pins with DVC: the data snapshot, and the frozen set unless a file is named."""
    return [data.data_dir] + ([] if evaluation.golden else [evaluation.golden_dir])


def uses_demo_data(data: DataConfig, evaluation: EvaluationConfig) -> bool:
    return not data.source and not evaluation.golden


def expected_demo_pins(
    data: DataConfig, evaluation: EvaluationConfig, copy_to: str | Path | None = None
) -> dict[str, Pin]:
    """The pointers the demo's first run writes, made by its data stage in a scratch repo
    (and copied into ``copy_to`` as DVC wrote them, to refresh a workspace's)."""
    from alignflow.data.demo import write_demo_source
    from alignflow.data.pipeline import add_dataset
    from alignflow.evaluation.golden import freeze_golden_set

    local = data.model_copy(update={"remote": None})
    with tempfile.TemporaryDirectory(prefix="alignflow-pins-") as tmp:
        repo = Path(tmp)
        versioning.ensure_repo(repo)
        snapshot = add_dataset(str(write_demo_source(local, repo)), local, repo_dir=repo)
        freeze_golden_set(snapshot.data_dir, repo, evaluation.golden_dir)
        written = [versioning.dvc_file(repo, folder) for folder in (data.data_dir, evaluation.golden_dir)]
        if copy_to is not None:
            for path in written:
                shutil.copyfile(path, Path(copy_to) / path.name)
        return {path.name: Pin.read(path) for path in written}


def stale_demo_pins(repo_dir: str | Path, data: DataConfig, evaluation: EvaluationConfig) -> list[str]:
    """One message per committed pointer that the demo's data stage no longer reproduces."""
    repo_dir = Path(repo_dir)
    stale = []
    for name, expected in expected_demo_pins(data, evaluation).items():
        path = repo_dir / name
        committed = Pin.read(path) if path.exists() else None
        if committed != expected:
            pinned = committed.md5 if committed else "nothing"
            stale.append(
                f"{path} pins {pinned}, but the demo's data stage now writes {expected.md5}: "
                f"run `{REFRESH_COMMAND}` and commit {name}"
            )
    return stale


def _in_dvc_store(repo_dir: Path, md5: str) -> str | None:
    """Where the pinned folder can be fetched from: the local cache or the default remote."""
    from dvc.repo import Repo

    if not (repo_dir / ".dvc").exists():
        return None
    with Repo(str(repo_dir)) as repo:
        if repo.cache.local.exists(md5):
            return "the DVC cache"
        try:
            remote = repo.cloud.get_remote_odb()
        except Exception:  # no default remote configured: nothing more to look in
            return None
        return f"the DVC remote {remote.path}" if remote.exists(md5) else None


def pin_status(repo_dir: str | Path, data: DataConfig, evaluation: EvaluationConfig) -> list[PinStatus]:
    """For each committed pointer: checked out, fetchable, rebuilt by the demo, or lost (with the fix)."""
    repo_dir = Path(repo_dir).resolve()
    statuses = []
    expected = None
    for folder in pinned_folders(data, evaluation):
        path = versioning.dvc_file(repo_dir, folder)
        if not path.exists():
            statuses.append(PinStatus(path.name, True, "nothing pinned yet: the first run pins it"))
            continue
        pin = Pin.read(path)
        where = _in_dvc_store(repo_dir, pin.md5) if pin.md5 else None
        if where:
            statuses.append(PinStatus(path.name, True, f"{pin.md5} restorable from {where}"))
            continue
        if uses_demo_data(data, evaluation):
            expected = expected or expected_demo_pins(data, evaluation)
            if expected.get(path.name) == pin:
                detail = f"{pin.md5} is rebuilt from the built-in demo data by the first run"
                statuses.append(PinStatus(path.name, True, detail))
                continue
            fix = f"run `{REFRESH_COMMAND}` (the demo's data stage moved) and commit {path.name}"
        else:
            fix = f"`dvc pull {path.name}` from the remote that holds it, or delete {path.name} to pin anew"
        detail = f"{pin.md5} is in neither the DVC cache nor the remote, and nothing here rebuilds it"
        statuses.append(PinStatus(path.name, False, detail, fix))
    return statuses
