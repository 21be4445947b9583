"""The pinned evaluation set: frozen once from the first eval split, DVC-tracked, or a user file."""

from __future__ import annotations

import json
import shutil

import pytest

from alignflow.data.config import DataConfig
from alignflow.data.demo import write_demo_dataset
from alignflow.data.pipeline import add_dataset
from alignflow.data.versioning import current_version
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.golden import GoldenSetError, load_golden_records, pin_golden_set


def _add(repo, source, eval_fraction=0.2):
    return add_dataset(source, DataConfig(eval_fraction=eval_fraction), repo_dir=repo)


def test_the_first_eval_split_is_frozen_and_later_data_versions_do_not_move_it(tmp_path):
    repo = tmp_path / "repo"
    inputs = write_demo_dataset(tmp_path / "in", n_pairs=300, n_scored=50, eval_fraction=0.2, phrasings=6)
    first = _add(repo, inputs["demo"])
    golden = pin_golden_set(EvaluationConfig(), first.data_dir, repo)
    assert golden.version == current_version(repo, "golden"), "tracked by golden.dvc"
    assert (repo / "golden.dvc").exists()
    assert golden.answers >= 100 and golden.pairs > 0
    assert first.version[:12] in golden.source
    pinned = {json.dumps(r["prompt"]) for r in golden.records()}

    # a new data version with other rows and another split: the pinned set stays as it was
    other = write_demo_dataset(tmp_path / "other", n_pairs=200, n_scored=0, seed=7, phrasings=6)
    second = _add(repo, other["pairs"], eval_fraction=0.5)
    assert second.version != first.version
    again = pin_golden_set(EvaluationConfig(), second.data_dir, repo)
    assert again.version == golden.version
    assert {json.dumps(r["prompt"]) for r in again.records()} == pinned


def test_a_pinned_set_tracked_but_not_checked_out_is_pulled_back(tmp_path):
    repo = tmp_path / "repo"
    inputs = write_demo_dataset(tmp_path / "in", n_pairs=200, n_scored=0, eval_fraction=0.2, phrasings=6)
    first = _add(repo, inputs["demo"])
    golden = pin_golden_set(EvaluationConfig(), first.data_dir, repo)
    for path in (repo / "golden").iterdir():
        path.unlink()
    assert pin_golden_set(EvaluationConfig(), first.data_dir, repo).version == golden.version
    assert load_golden_records(repo / "golden")


def test_a_user_file_is_validated_and_versioned_by_its_md5(tmp_path):
    rows = [{"prompt": f"What is {i} plus 1?", "metadata": {"answer": i + 1}} for i in range(40)]
    path = tmp_path / "pinned.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    golden = pin_golden_set(EvaluationConfig(golden=str(path)), tmp_path, tmp_path)
    assert (golden.prompts, golden.answers, golden.pairs) == (40, 40, 0)
    assert len(golden.version) == 32
    path.write_text(path.read_text() + json.dumps({"prompt": "What is 9 plus 9?"}) + "\n")
    assert pin_golden_set(EvaluationConfig(golden=str(path)), tmp_path, tmp_path).version != golden.version


def test_a_bad_pinned_file_names_the_file_row_and_field(tmp_path):
    path = tmp_path / "pinned.jsonl"
    path.write_text(
        json.dumps({"prompt": "What is 1 plus 1?", "chosen": "The answer is 2.", "rejected": "I think 3"})
        + "\n"
        + json.dumps({"prompt": "What is 2 plus 2?", "chosen": "", "rejected": "I think 5"})
        + "\n"
    )
    with pytest.raises(GoldenSetError, match=r"pinned\.jsonl.*1 pinned row.*pinned\.jsonl:2 \[chosen\]"):
        pin_golden_set(EvaluationConfig(golden=str(path)), tmp_path, tmp_path)
    with pytest.raises(GoldenSetError, match="does not exist"):
        pin_golden_set(EvaluationConfig(golden=str(tmp_path / "missing.jsonl")), tmp_path, tmp_path)


def _lose_every_copy(repo):
    for folder in (repo / "golden", repo / ".dvc" / "cache", repo / ".alignflow" / "dvc-remote"):
        shutil.rmtree(folder)


def test_a_lost_pinned_set_is_rebuilt_only_when_the_rebuild_has_the_same_md5(tmp_path):
    repo = tmp_path / "repo"
    inputs = write_demo_dataset(tmp_path / "in", n_pairs=200, n_scored=0, eval_fraction=0.2, phrasings=6)
    first = _add(repo, inputs["demo"])
    golden = pin_golden_set(EvaluationConfig(), first.data_dir, repo)
    _lose_every_copy(repo)  # a fresh clone: golden.dvc committed, its cache nowhere
    assert pin_golden_set(EvaluationConfig(), first.data_dir, repo).version == golden.version


def test_a_pinned_set_that_cannot_be_restored_is_an_error_not_a_new_yardstick(tmp_path):
    repo = tmp_path / "repo"
    inputs = write_demo_dataset(tmp_path / "in", n_pairs=200, n_scored=0, eval_fraction=0.2, phrasings=6)
    golden = pin_golden_set(EvaluationConfig(), _add(repo, inputs["demo"]).data_dir, repo)
    pinned = (repo / "golden.dvc").read_text()
    other = write_demo_dataset(tmp_path / "other", n_pairs=150, n_scored=0, seed=5, phrasings=6)
    second = _add(repo, other["pairs"], eval_fraction=0.5)
    _lose_every_copy(repo)
    with pytest.raises(GoldenSetError, match=f"pins evaluation set {golden.version}.*dvc pull golden.dvc"):
        pin_golden_set(EvaluationConfig(), second.data_dir, repo)
    assert (repo / "golden.dvc").read_text() == pinned, "the pin is kept for a later dvc pull"
    assert not (repo / "golden").exists()
