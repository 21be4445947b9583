"""`alignflow data ...` end to end: exit codes, the HH-RLHF file, and DVC round trips."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from alignflow.cli import app

runner = CliRunner()


def test_hh_rlhf_reads_every_row_and_names_unsplittable_ones(hh_rlhf_path, tmp_path):
    report_path = tmp_path / "report.json"
    result = runner.invoke(app, ["data", "validate", str(hh_rlhf_path), "--report", str(report_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["input_rows"] == 2312 and report["kinds"] == {"pair": report["kept"]}
    assert report["kept"] + report["quarantined"] == 2312
    unsplittable = report["examples"]["hh_unsplittable"]
    assert report["counts_by_reason"]["hh_unsplittable"] == len(unsplittable) > 0
    assert all(e["file"] == str(hh_rlhf_path) and e["row"] for e in unsplittable)
    assert f"{hh_rlhf_path}:{unsplittable[0]['row']}" in result.output.replace("\n", "")


def test_exit_codes_valid_invalid_unreadable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a failed validation writes its report in the working directory
    good = tmp_path / "good.jsonl"
    good.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "chosen": "a", "rejected": "b"}) + "\n" for i in range(20))
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"prompt": "x", "chosen": "a", "rejected": "a"}\n' * 5)
    assert runner.invoke(app, ["data", "validate", str(good)]).exit_code == 0
    failed = runner.invoke(app, ["data", "validate", str(bad)])
    assert failed.exit_code == 1 and "chosen_equals_rejected" in failed.output
    report = json.loads((tmp_path / ".alignflow" / "reports" / "validate-report.json").read_text())
    assert report, "the default report of a failed validation lies in the workspace"
    assert runner.invoke(app, ["data", "validate", str(tmp_path / "missing.jsonl")]).exit_code == 2
    assert runner.invoke(app, ["data", "validate", str(good), "--format", "xml"]).exit_code == 2
    assert runner.invoke(app, ["data", "validate", str(good), "--set", "data.nope=1"]).exit_code == 2


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.slow
def test_two_adds_give_two_versions_and_checkout_pull_restores_the_first(tmp_path, monkeypatch):
    # away from the checkout: after `make demo` its mlflow.db holds a champion reward model,
    # whose label check would judge these pairs (seen failing in a clone where the demo had run)
    monkeypatch.chdir(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    demo = runner.invoke(app, ["data", "demo", str(tmp_path / "in"), "--rows", "300"])
    assert demo.exit_code == 0, demo.output
    versions, snapshots = [], []
    for name in ("pairs.jsonl", "scored.jsonl"):
        result = runner.invoke(app, ["data", "add", str(tmp_path / "in" / name), "--repo", str(repo)])
        assert result.exit_code == 0, result.output
        versions.append(result.output.split("data version:")[1].split()[0])
        snapshots.append({p.name: p.read_bytes() for p in (repo / "data").iterdir()})
        _git(repo, "add", "data.dvc", ".gitignore", ".dvc/config")
        _git(repo, "commit", "-q", "-m", f"data {name}")
    assert versions[0] != versions[1] and versions[0].endswith(".dir")
    assert set(snapshots[0]) == {
        "train.parquet",
        "eval.parquet",
        "quarantine.parquet",
        "manifest.json",
        "report.json",
    }

    _git(repo, "checkout", "HEAD~1", "--", "data.dvc")
    shutil.rmtree(repo / "data")
    shutil.rmtree(repo / ".dvc" / "cache")  # force the bytes to come from the remote
    from alignflow.data.versioning import current_version, pull

    assert current_version(repo) == versions[0]
    pull(repo)
    restored = {p.name: p.read_bytes() for p in (repo / "data").iterdir()}
    assert restored == snapshots[0]

    shown = runner.invoke(app, ["data", "show", "--repo", str(repo)])
    unwrapped = shown.output.replace("\n", "")  # the console folds a long path (a worker's tmp path)
    assert shown.exit_code == 0 and versions[0] in shown.output and "pairs.jsonl" in unwrapped


@pytest.mark.slow
def test_same_input_gives_the_same_version(tmp_path):
    from alignflow.data.demo import write_demo_dataset
    from alignflow.data.pipeline import add_dataset

    paths = write_demo_dataset(tmp_path / "in", n_pairs=200, n_scored=50)
    first = add_dataset(paths["demo"], repo_dir=tmp_path / "r1", push=False)
    second = add_dataset(paths["demo"], repo_dir=tmp_path / "r2", push=False)
    assert first.version == second.version
    assert sum(first.counts.values()) == first.validation.input_rows
