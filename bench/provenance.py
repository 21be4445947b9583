"""Which code a bench result came from, so a figure can be traced to the commit that made it.

A result kept in ``bench/results/`` outlives the code it measured; without the commit, a ratio
measured before a change reads as if measured after it. A copy of the checkout without its
``.git`` (the lent GPU machine's) reads the commit ``tools/gpu_prepare.py`` stamped beside its
payload.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from alignflow.code_version import UNKNOWN, git_commit

REPO = Path(__file__).resolve().parents[1]
# where tools/gpu_prepare.py leaves the commit in its payload (carried whole as ".gpu") for the
# GPU machine's copy of the tree, which has no .git
STAMP = Path(".gpu") / "code_commit"
# what a result depends on; bench/results/ is what a bench run itself rewrites
CODE_PATHS = ("alignflow", "bench", "configs", "tools", "pyproject.toml", "requirements", ":!bench/results")
UNCOMMITTED = "+uncommitted"
SHORT = 7  # git's own short form


def code_commit(repo: str | Path = REPO) -> str:
    """The checkout's short commit, with ``+uncommitted`` where its code differs from it (a file
    changed or new); a copy without git: the commit stamped in its GPU payload (``stamped
    <sha>``); else ``unknown``."""
    repo = Path(repo)
    head = git_commit(repo)
    if head != UNKNOWN:
        return head[:SHORT] + (UNCOMMITTED if _code_changed(repo) else "")
    stamp = repo / STAMP
    stamped = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else ""
    return f"stamped {stamped}" if stamped else UNKNOWN


def write_stamp(repo: str | Path = REPO) -> str:
    """Leave this checkout's :func:`code_commit` in its GPU payload, for the copy that lacks .git."""
    commit = code_commit(repo)
    stamp = Path(repo) / STAMP
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(commit + "\n", encoding="utf-8")
    return commit


def _code_changed(repo: Path) -> bool:
    """Whether a tracked file under :data:`CODE_PATHS` differs from the commit, or a new one is there."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--", *CODE_PATHS],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(done.stdout.strip())
