"""DVC versioning of snapshots: ``data/`` tracked by ``data.dvc``, pushed to a remote.

The data version everywhere downstream is the md5 DVC writes into ``data.dvc``
(``outs[0].md5``). Any DVC remote works; with none configured the repo gets a local
remote under ``.alignflow/dvc-remote`` so a fresh clone can version data with no server.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import yaml

from alignflow.logs import logger_level

DEFAULT_REMOTE_NAME = "alignflow"
LOCAL_REMOTE = Path(".alignflow") / "dvc-remote"


class VersioningError(RuntimeError):
    """DVC or git refused an operation; the message says which and why."""


def quiet_dvc():
    """Hide DVC's "now run git add" hints: the CLI prints its own summary of what happened."""
    return logger_level("dvc", logging.WARNING)


def dvc_file(repo_dir: str | Path, data_dir: str = "data") -> Path:
    return Path(repo_dir) / f"{Path(data_dir).name}.dvc"


def ensure_repo(repo_dir: str | Path, remote: str | None = None) -> Path:
    """Make ``repo_dir`` a git + DVC repo with a default remote (created when missing)."""
    from dvc.repo import Repo

    repo_dir = Path(repo_dir).resolve()
    repo_dir.mkdir(parents=True, exist_ok=True)
    if not (repo_dir / ".git").exists():
        _git(repo_dir, "init", "-q")
    if not (repo_dir / ".dvc").exists():
        with quiet_dvc():
            Repo.init(str(repo_dir)).close()
    configure_remote(repo_dir, remote)
    return repo_dir


def configure_remote(repo_dir: Path, remote: str | None) -> str:
    """Use ``remote`` when given, else keep the repo's default remote, else a local one."""
    from dvc.repo import Repo

    with Repo(str(repo_dir)) as repo, repo.config.edit() as conf:
        default = conf["core"].get("remote")
        if remote is None and default:
            return default
        if remote is None:
            (repo_dir / LOCAL_REMOTE).mkdir(parents=True, exist_ok=True)
            # DVC reads a relative URL given here against the cwd and stores it relative to
            # .dvc/config, so the committed config stays valid wherever the repo is cloned
            url = os.path.relpath(repo_dir / LOCAL_REMOTE)
        else:
            url = remote
        conf["remote"][DEFAULT_REMOTE_NAME] = {"url": url}
        conf["core"]["remote"] = DEFAULT_REMOTE_NAME
    return DEFAULT_REMOTE_NAME


def track(repo_dir: str | Path, data_dir: str = "data") -> str:
    """``dvc add`` the snapshot directory; returns the data version (md5 in the .dvc file)."""
    from dvc.repo import Repo

    with quiet_dvc(), Repo(str(repo_dir)) as repo:
        repo.add(str(Path(repo_dir).resolve() / data_dir))
    version = current_version(repo_dir, data_dir)
    assert version is not None, "dvc add wrote no data version"  # it has just written the .dvc file
    return version


def push(repo_dir: str | Path, data_dir: str = "data") -> None:
    from dvc.repo import Repo

    with quiet_dvc(), Repo(str(repo_dir)) as repo:
        repo.push(targets=[str(dvc_file(repo_dir, data_dir).resolve())])


def pull(repo_dir: str | Path, data_dir: str = "data") -> None:
    """Restore the snapshot that ``data.dvc`` points at, fetching from the remote as needed."""
    from dvc.repo import Repo

    with quiet_dvc(), Repo(str(repo_dir)) as repo:
        repo.pull(targets=[str(dvc_file(repo_dir, data_dir).resolve())], force=True)


def current_version(repo_dir: str | Path, data_dir: str = "data") -> str | None:
    """The md5 recorded in ``data.dvc``, or None when no snapshot is tracked."""
    path = dvc_file(repo_dir, data_dir)
    if not path.exists():
        return None
    outs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("outs") or []
    return outs[0].get("md5") if outs else None


def _git(repo_dir: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise VersioningError(f"git {' '.join(args)} failed in {repo_dir}: {done.stderr.strip()}")
    return done.stdout
