"""Which code is running: a hash of its source, so that cached results are invalidated by the code
that made them, and the git commit checked out, for tags and bench results."""

from __future__ import annotations

import hashlib
import subprocess
from functools import cache
from pathlib import Path

UNKNOWN = "unknown"


def source_digest(root: str | Path) -> str:
    """A short hash of every Python file under ``root``: relative names and bytes, the same in any clone."""
    root = Path(root)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@cache
def package_digest() -> str:
    """:func:`source_digest` of the installed ``alignflow`` package: the code that ran, whether
    or not the working folder is a git checkout (an installed wheel has no commit)."""
    import alignflow

    return source_digest(Path(alignflow.__file__).parent)


def git_commit(path: str | Path = ".") -> str:
    """The commit checked out in the repository containing ``path``, or ``"unknown"``.

    A run started outside a git checkout (an installed wheel, a container) must still be
    taggable, so every failure collapses to ``"unknown"`` instead of raising.
    """
    try:
        result = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and commit else UNKNOWN
