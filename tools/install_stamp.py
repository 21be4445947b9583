"""A stamp that lets ``make install`` skip pip when nothing it would install has changed.

The stamp records a digest of what an install depends on: the interpreter (a venv used
without activation is another environment), where the project is checked out (an editable
install points at one clone), the lock, ``pyproject.toml`` and every file of the installed
packages. Any change to one of them, or an environment that no longer matches the lock, and
``check`` fails, so the next ``make install`` runs pip again. Standard library only: it runs
before anything is installed.

    python -m tools.install_stamp check   # exit 0 when the last install still holds
    python -m tools.install_stamp write   # after a successful install
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = ROOT / ".alignflow" / "install.stamp"
INPUTS = ("pyproject.toml", "requirements/lock.txt")
PACKAGES = ("alignflow",)


def _project_files() -> list[Path]:
    files = [ROOT / name for name in INPUTS]
    for package in PACKAGES:
        found = (ROOT / package).rglob("*")
        files += sorted(p for p in found if p.is_file() and "__pycache__" not in p.parts)
    return files


def digest() -> str:
    """What the install depends on, as one sha256."""
    h = hashlib.sha256()
    for part in (sys.executable, sys.prefix, str(ROOT)):
        h.update(part.encode() + b"\0")
    for path in _project_files():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _installed_from_here() -> bool:
    """The environment's alignflow is an editable install of this checkout, not of another clone.

    Looked up with this checkout left off ``sys.path``: run from here, ``python -m`` would find
    the package in the working directory whatever is installed.
    """
    from importlib.util import find_spec

    saved = sys.path[:]
    sys.path[:] = [p for p in saved if p and Path(p).resolve() != ROOT]
    try:
        spec = find_spec("alignflow")
    finally:
        sys.path[:] = saved
    origin = spec.origin if spec else None
    return origin is not None and Path(origin).resolve().is_relative_to(ROOT)


def stale_reasons() -> list[str]:
    if not STAMP.exists():
        return ["no install recorded for this checkout"]
    if STAMP.read_text(encoding="utf-8").strip() != digest():
        return ["the interpreter, the lock, pyproject.toml or the package sources changed"]
    try:
        from tools.lockfile import installed_mismatches
    except ImportError as exc:  # packaging missing: the environment is not what was installed
        return [f"cannot check the environment against the lock ({exc})"]
    reasons = installed_mismatches()
    if not _installed_from_here():
        reasons.append(f"alignflow is not installed from {ROOT}")
    return reasons


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "write":
        STAMP.parent.mkdir(parents=True, exist_ok=True)
        STAMP.write_text(digest() + "\n", encoding="utf-8")
        return 0
    if command != "check":
        print(f"usage: python -m tools.install_stamp [check|write], not {command!r}", file=sys.stderr)
        return 2
    reasons = stale_reasons()
    for reason in reasons:
        print(f"install needed: {reason}", file=sys.stderr)
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
