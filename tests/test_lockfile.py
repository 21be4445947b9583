"""The environment lock: it fits pyproject.toml, the install matches it, and drift is caught."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tools import lockfile

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path) -> tuple[Path, Path]:
    """A copy of pyproject.toml and the lock that a test may edit."""
    pyproject, lock = tmp_path / "pyproject.toml", tmp_path / "lock.txt"
    shutil.copy(lockfile.PYPROJECT, pyproject)
    shutil.copy(lockfile.LOCK, lock)
    return pyproject, lock


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_the_committed_lock_fits_pyproject():
    assert lockfile.lock_problems() == []


def test_this_environment_has_every_locked_version():
    """What `make install` leaves behind is the lock, package for package (pip freeze == lock)."""
    assert lockfile.installed_mismatches() == []


def test_a_range_changed_without_relocking_fails_the_check(project):
    pyproject, lock = project
    # the locked pandas still satisfies the new range: only the recorded digest can notice
    _edit(pyproject, '"pandas>=2.1"', '"pandas>=2.0"')
    problems = lockfile.lock_problems(pyproject, lock)
    assert len(problems) == 1 and "make lock" in problems[0]


def test_a_range_that_excludes_the_pin_is_named(project):
    pyproject, lock = project
    pinned = lockfile.read_lock(lock).pins["pandas"]
    _edit(pyproject, '"pandas>=2.1"', f'"pandas>{pinned}"')
    problems = lockfile.lock_problems(pyproject, lock)
    assert any(f"pandas=={pinned}" in p and "outside" in p for p in problems), problems


def test_a_dependency_added_without_relocking_is_named(project):
    pyproject, lock = project
    _edit(pyproject, '"pyyaml>=6",', '"pyyaml>=6",\n    "a-package-nobody-locked>=1",')
    problems = lockfile.lock_problems(pyproject, lock)
    assert any("a-package-nobody-locked" in p and "not in" in p for p in problems), problems


def test_reformatting_pyproject_keeps_the_lock_valid(project):
    pyproject, lock = project
    _edit(pyproject, '"pandas>=2.1",', '"pandas >= 2.1" ,  # reformatted')
    assert lockfile.lock_problems(pyproject, lock) == []


def test_a_package_installed_at_another_version_is_reported(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("pytest==0.0.1\ntorch==2.13.0\nno-such-dist==1.0\n", encoding="utf-8")
    mismatches = lockfile.installed_mismatches(lock)
    assert any(m.startswith("pytest: locked 0.0.1, installed") for m in mismatches), mismatches
    assert "no-such-dist: locked 1.0, not installed" in mismatches
    assert not any(m.startswith("torch") for m in mismatches), "a +cpu build is the locked torch"


def test_a_lock_line_that_is_not_an_exact_pin_is_refused(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("pandas>=2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not an exact pin"):
        lockfile.read_lock(lock)


def test_the_docker_image_installs_the_locked_torch():
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    declared = re.search(r"ARG TORCH_VERSION=(\S+)", dockerfile).group(1)
    assert declared == lockfile.read_lock().pins["torch"]
    assert "-c requirements/lock.txt" in dockerfile
