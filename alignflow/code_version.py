"""A hash of source code, so that cached results are invalidated by the code that made them."""

from __future__ import annotations

import hashlib
from pathlib import Path


def source_digest(root: str | Path) -> str:
    """A short hash of every Python file under ``root``: relative names and bytes, the same in any clone."""
    root = Path(root)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
