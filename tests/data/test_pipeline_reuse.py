"""``add_dataset`` reuses the tracked snapshot for an input it has already versioned, and only then."""

from __future__ import annotations

import json

import pytest

from alignflow.data import pipeline
from alignflow.data.config import DataConfig
from alignflow.data.demo import write_demo_dataset
from alignflow.data.pipeline import HISTORY, add_dataset, find_tracked_version


@pytest.fixture
def added(tmp_path):
    """A repo with one tracked version of a small demo file."""
    source = write_demo_dataset(tmp_path / "in", n_pairs=200, n_scored=50)["demo"]
    repo = tmp_path / "repo"
    first = add_dataset(source, repo_dir=repo, push=False)
    return source, repo, first


def _forbid_validation(monkeypatch):
    def validate_paths(*args, **kwargs):
        raise AssertionError("the input was validated again")

    monkeypatch.setattr(pipeline, "validate_paths", validate_paths)


def _history(repo) -> list[dict]:
    return [json.loads(line) for line in (repo / HISTORY).read_text().splitlines()]


def test_the_same_input_comes_back_as_the_tracked_version_without_validation(added, monkeypatch):
    source, repo, first = added
    assert not first.reused
    _forbid_validation(monkeypatch)
    again = add_dataset(source, repo_dir=repo, push=False)
    assert again.reused and again.version == first.version
    assert again.counts == first.counts and again.validation.kept == first.validation.kept
    assert find_tracked_version(source, repo_dir=repo).version == first.version
    assert len(_history(repo)) == 1, "a reuse is not a new version"


def _append_row(source, repo):
    with source.open("a") as fh:
        fh.write(json.dumps({"prompt": "What is 9 + 9?", "chosen": "18", "rejected": "17"}) + "\n")
    return DataConfig()


def _change_split(source, repo):
    return DataConfig(eval_fraction=0.2)


def _edit_snapshot(source, repo):
    report = repo / "data" / "report.json"
    report.write_text(report.read_text() + " ")
    return DataConfig()


@pytest.mark.parametrize("change", [_append_row, _change_split, _edit_snapshot])
def test_a_changed_input_config_or_snapshot_is_validated_again(added, change):
    source, repo, first = added
    config = change(source, repo)
    assert find_tracked_version(source, config, repo) is None
    again = add_dataset(source, config, repo_dir=repo, push=False)
    assert not again.reused
    assert len(_history(repo)) == 2
    if change is not _edit_snapshot:
        assert again.version != first.version


def test_reuse_off_always_validates(added):
    source, repo, first = added
    again = add_dataset(source, repo_dir=repo, push=False, reuse=False)
    assert not again.reused and again.version == first.version
