"""The demo's committed DVC pointers stay what its data stage writes, and a lost pin is named.

A fresh clone has ``data.dvc`` and ``golden.dvc`` but no DVC cache: the demo's first run
rebuilds both folders and restores the pins only if the bytes are the same. A change to the
data stage that moves them used to land unnoticed and break every fresh clone's ``make demo``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from alignflow.config import load_config
from alignflow.data.pipeline import add_dataset
from alignflow.evaluation.pins import pin_status, stale_demo_pins

REPO = Path(__file__).resolve().parents[2]
DEMO = load_config(REPO / "configs" / "demo.yaml")


def test_the_committed_demo_pins_are_what_the_demo_data_stage_writes():
    stale = stale_demo_pins(REPO, DEMO.data, DEMO.evaluation)
    assert not stale, "\n".join(stale)


def test_a_data_stage_that_moves_the_demo_bytes_names_each_pointer_and_the_refresh_command():
    moved = DEMO.data.model_copy(update={"demo_rows": DEMO.data.demo_rows - 1})
    stale = stale_demo_pins(REPO, moved, DEMO.evaluation)
    assert len(stale) == 2, stale
    for name, message in zip(("data.dvc", "golden.dvc"), stale, strict=True):
        assert f"{REPO / name} pins " in message
        assert f"run `make pins` and commit {name}" in message


@pytest.fixture()
def clone(tmp_path) -> Path:
    """A workspace as a fresh clone has it: the committed pointers, no data, no DVC cache."""
    for name in ("data.dvc", "golden.dvc"):
        shutil.copyfile(REPO / name, tmp_path / name)
    return tmp_path


def by_file(statuses) -> dict:
    return {s.file: s for s in statuses}


def test_a_fresh_clone_of_the_demo_is_restorable_by_its_first_run(clone):
    statuses = by_file(pin_status(clone, DEMO.data, DEMO.evaluation))
    assert statuses.keys() == {"data.dvc", "golden.dvc"}
    assert all(s.ok for s in statuses.values()), statuses
    assert "rebuilt from the built-in demo data" in statuses["golden.dvc"].detail


def test_a_stale_demo_pin_is_reported_with_its_fix(clone):
    golden = clone / "golden.dvc"
    golden.write_text(golden.read_text().replace("md5: ", "md5: 0"), encoding="utf-8")
    statuses = by_file(pin_status(clone, DEMO.data, DEMO.evaluation))
    assert statuses["data.dvc"].ok
    assert not statuses["golden.dvc"].ok
    assert "neither the DVC cache nor the remote" in statuses["golden.dvc"].detail
    assert "make pins" in statuses["golden.dvc"].fix


def test_a_pin_of_user_data_that_nothing_holds_says_to_pull_it_or_pin_anew(clone, tmp_path):
    user_data = DEMO.data.model_copy(update={"source": str(tmp_path / "prefs.jsonl")})
    statuses = by_file(pin_status(clone, user_data, DEMO.evaluation))
    assert not statuses["data.dvc"].ok and not statuses["golden.dvc"].ok
    assert "dvc pull golden.dvc" in statuses["golden.dvc"].fix
    assert "delete golden.dvc" in statuses["golden.dvc"].fix


def test_a_version_in_the_dvc_cache_is_restorable(tmp_path):
    """A workspace that versioned its own data holds it in its cache: nothing to rebuild."""
    source = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"{a}+{a}?", "chosen": str(2 * a), "rejected": str(2 * a + 1)} for a in (2, 3)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    data = DEMO.data.model_copy(update={"source": str(source), "eval_fraction": 0.5})
    version = add_dataset(str(source), data, repo_dir=tmp_path).version
    statuses = by_file(pin_status(tmp_path, data, DEMO.evaluation.model_copy(update={"golden": "x.jsonl"})))
    assert list(statuses) == ["data.dvc"]
    assert statuses["data.dvc"].ok
    assert statuses["data.dvc"].detail == f"{version} restorable from the DVC cache"
