"""A bench result names the code it measured: the commit, whether the checkout differed from it,
and on a copy without git the commit stamped in its GPU payload."""

from __future__ import annotations

import json
import subprocess
import types

import pytest

import bench.__main__ as bench_main
from bench.provenance import STAMP, UNCOMMITTED, code_commit, write_stamp


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A committed checkout with code, a config and a bench result."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    for name, text in {
        "alignflow/stage.py": "STEPS = 1\n",
        "configs/demo.yaml": "seed: 0\n",
        "bench/results/speed.md": "1.0x\n",
        "README.md": "# readme\n",
    }.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "code")
    return repo


def test_a_clean_checkout_is_its_commit(checkout):
    assert code_commit(checkout) == _git(checkout, "rev-parse", "--short", "HEAD")


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("alignflow/stage.py", "STEPS = 2\n"),
        ("configs/demo.yaml", "seed: 1\n"),
        ("alignflow/new.py", "X = 1\n"),
    ],
)
def test_changed_or_new_code_is_named_as_uncommitted(checkout, path, text):
    (checkout / path).write_text(text)
    assert code_commit(checkout) == _git(checkout, "rev-parse", "--short", "HEAD") + UNCOMMITTED


def test_results_and_prose_a_run_rewrites_leave_the_commit_as_it_is(checkout):
    (checkout / "bench/results/speed.md").write_text("2.0x\n")
    (checkout / "bench/results/new.json").write_text("{}\n")
    (checkout / "README.md").write_text("# changed\n")
    assert code_commit(checkout) == _git(checkout, "rev-parse", "--short", "HEAD")


def test_a_copy_without_git_reads_the_stamp_its_payload_carries(checkout, tmp_path):
    stamped = write_stamp(checkout)
    assert (checkout / STAMP).read_text().strip() == stamped
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(checkout), str(copy)], check=True)
    subprocess.run(["rm", "-rf", str(copy / ".git")], check=True)
    assert code_commit(copy) == f"stamped {stamped}"
    (copy / STAMP).unlink()
    assert code_commit(copy) == "unknown"


def test_python_m_bench_files_each_result_with_the_code_that_ran(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(run=lambda: {"speedup": 2.0})
    monkeypatch.setattr(bench_main, "discover", lambda: ["fake_bench"])
    monkeypatch.setattr(bench_main.importlib, "import_module", lambda name: fake)
    monkeypatch.setattr(bench_main, "RESULTS", tmp_path)
    monkeypatch.setattr(bench_main, "code_commit", lambda: "abc1234")
    assert bench_main.main(["fake"]) == 0
    result = json.loads((tmp_path / "fake.json").read_text())
    assert result["code_commit"] == "abc1234" and result["speedup"] == 2.0
    assert "| fake | code_commit | abc1234 |" in (tmp_path / "README.md").read_text()
