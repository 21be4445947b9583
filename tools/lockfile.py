"""The environment lock: refresh it, check it against ``pyproject.toml``, check an install against it.

``pyproject.toml`` keeps ranges (what ``pip install alignflow`` accepts); ``requirements/lock.txt``
pins every package of the runtime + dev environment for Python 3.11 on Linux (CPU), resolved by
``uv pip compile``. ``make install`` installs through it as a pip constraints file, so a fresh
machine gets the versions the suite last passed with instead of whatever was released today.

The lock's first line records a digest of the dependency declarations it was resolved from, so
a range edited without relocking is caught even when the old pin still satisfies the new range.

    python -m tools.lockfile refresh            # re-resolve (make lock)
    python -m tools.lockfile refresh --keep-pins  # resolve only what is new; every pin stays
    python -m tools.lockfile check              # pyproject and lock agree (make lock-check)
    python -m tools.lockfile verify-installed   # this environment matches the lock
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements" / "lock.txt"
DIGEST_PREFIX = "# dependencies-sha256: "
# what the lock is resolved for: CI's and the developers' machines (Python 3.11.7); markers such
# as redis' `python_full_version < "3.11.3"` resolve the same for any later 3.11
PYTHON_VERSION = "3.11.7"
PLATFORM = "x86_64-manylinux_2_28"
# torch is installed first, as the CPU build (a plain requirement resolves to the CUDA build and
# its multi-GB nvidia packages); the lock pins the public version so CUDA images satisfy it too
TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LOCKED_EXTRAS = ("dev",)
# the environment the lock's markers are judged in (Linux, CPython 3.11)
TARGET_ENV = {
    "python_version": PYTHON_VERSION.rsplit(".", 1)[0],
    "python_full_version": PYTHON_VERSION,
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def declared_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """The runtime requirements and those of the locked extras, as declared."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    declared = list(project.get("dependencies", []))
    for extra in LOCKED_EXTRAS:
        declared += project.get("optional-dependencies", {}).get(extra, [])
    return [Requirement(text) for text in declared]


def dependency_digest(pyproject: Path = PYPROJECT) -> str:
    """A digest of what the lock is resolved from; formatting and order do not change it."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    payload = {
        "requires-python": project.get("requires-python", ""),
        "requirements": sorted(str(r) for r in declared_requirements(pyproject)),
        "torch": TORCH_VERSION,
        "python": PYTHON_VERSION,
        "platform": PLATFORM,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Lock:
    digest: str | None
    pins: dict[str, str]  # canonical name -> exact version


def read_lock(path: Path = LOCK) -> Lock:
    """Pins (``name==version`` lines) and the recorded dependency digest of a lock file."""
    digest, pins = None, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(DIGEST_PREFIX):
            digest = line.removeprefix(DIGEST_PREFIX).strip()
        stripped = line.split("#", 1)[0].strip()
        if not stripped or stripped.startswith("-"):
            continue
        name, sep, version = stripped.partition("==")
        if not sep:
            raise ValueError(f"{path}: {line!r} is not an exact pin (name==version)")
        pins[canonicalize_name(name.split("[")[0])] = version.split(";")[0].strip()
    return Lock(digest, pins)


def _applies(requirement: Requirement, extra: str = "") -> bool:
    return requirement.marker is None or requirement.marker.evaluate({**TARGET_ENV, "extra": extra})


def lock_problems(pyproject: Path = PYPROJECT, lock_path: Path = LOCK) -> list[str]:
    """Why the lock does not fit ``pyproject.toml``; empty when it does."""
    if not lock_path.exists():
        return [f"{lock_path} is missing: run `make lock`"]
    lock = read_lock(lock_path)
    problems = []
    if lock.digest != dependency_digest(pyproject):
        problems.append(
            f"{pyproject.name} declares other dependencies than {lock_path.name} was resolved from "
            "(a range or package changed without relocking): run `make lock`, then `make test`"
        )
    for requirement in declared_requirements(pyproject):
        if not _applies(requirement):
            continue
        name = canonicalize_name(requirement.name)
        pinned = lock.pins.get(name)
        if pinned is None:
            problems.append(f"{requirement.name} is required ({requirement}) but not in {lock_path.name}")
        elif not requirement.specifier.contains(Version(pinned), prereleases=True):
            problems.append(f"{lock_path.name} pins {name}=={pinned}, outside the declared {requirement}")
    return problems


def public_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: a build's local label does not change what was locked."""
    return str(Version(version).public)


def installed_mismatches(lock_path: Path = LOCK) -> list[str]:
    """Locked packages this environment lacks or has at another version."""
    mismatches = []
    for name, pinned in sorted(read_lock(lock_path).pins.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            mismatches.append(f"{name}: locked {pinned}, not installed")
            continue
        if Version(public_version(installed)) != Version(public_version(pinned)):
            mismatches.append(f"{name}: locked {pinned}, installed {installed}")
    return mismatches


def _torch_source() -> list[str]:
    """Where the CPU build of torch is found: a local wheel folder when pip has one, else PyTorch's index."""
    links = os.environ.get("PIP_FIND_LINKS")
    if links:
        return [arg for folder in links.split() for arg in ("--find-links", folder)]
    return ["--index", TORCH_CPU_INDEX, "--index-strategy", "unsafe-best-match"]


def kept_pins(lock_path: Path = LOCK) -> str:
    """The current lock's pins as uv constraints (torch aside: its CPU build is pinned separately)."""
    pins = read_lock(lock_path).pins
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()) if name != "torch")


def refresh(lock_path: Path = LOCK, keep_pins: bool = False) -> None:
    """Resolve the environment with uv and write the lock with its digest.

    ``keep_pins`` holds every package already locked at its version, so adding a dependency
    resolves only the new packages instead of moving the other pins to today's releases.
    """
    with tempfile.TemporaryDirectory() as tmp:
        constraint = Path(tmp) / "torch.txt"
        kept = kept_pins(lock_path) if keep_pins and lock_path.exists() else ""
        constraint.write_text(f"torch=={TORCH_VERSION}+cpu\n" + kept, encoding="utf-8")
        resolved = Path(tmp) / "lock.txt"
        command = [
            sys.executable, "-m", "uv", "pip", "compile", str(PYPROJECT),
            *(arg for extra in LOCKED_EXTRAS for arg in ("--extra", extra)),
            "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
            "--constraint", str(constraint), *_torch_source(),
            "--no-header", "--no-annotate", "--quiet", "--output-file", str(resolved),
        ]  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT)
        cpu_pin, public_pin = f"torch=={TORCH_VERSION}+cpu", f"torch=={TORCH_VERSION}"
        pins = resolved.read_text(encoding="utf-8").replace(cpu_pin, public_pin)
    header = [
        f"# The environment the test suite passed with (Python {PYTHON_VERSION}, Linux, CPU): runtime + dev.",
        "# Generated by `make lock` (tools/lockfile.py with uv); do not edit by hand.",
        DIGEST_PREFIX + dependency_digest(),
    ]
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path.write_text("\n".join(header) + "\n" + pins, encoding="utf-8")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "refresh":
        refresh(keep_pins="--keep-pins" in argv[1:])
        print(f"wrote {LOCK.relative_to(ROOT)} ({len(read_lock().pins)} packages); now run `make test`")
        return 0
    if command == "check":
        problems = lock_problems()
    elif command == "verify-installed":
        problems = installed_mismatches()
    else:
        usage = "python -m tools.lockfile [refresh [--keep-pins]|check|verify-installed]"
        print(f"usage: {usage}, not {command!r}")
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
