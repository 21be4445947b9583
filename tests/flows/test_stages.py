"""A cached stage result is trusted only while what it points at is still there."""

from __future__ import annotations

import mlflow

from alignflow.config import load_config
from alignflow.flows.stages import reusable
from alignflow.tasks.stage_inputs import StageInputs


def inputs_for(tracking_uri: str) -> StageInputs:
    config = load_config(None, [f"tracking.uri={tracking_uri}"])
    return StageInputs(
        config_json=config.model_dump(mode="json"),
        data_dir="data",
        output_dir="outputs/sft",
        data_version="v1",
        config_hash="h",
    )


def test_a_cache_hit_is_reused_only_while_its_files_and_the_run_that_made_them_exist(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(store)
    with mlflow.start_run() as run:
        made_by = run.info.run_id
    mlflow.set_tracking_uri(None)
    model = tmp_path / "model"
    model.mkdir()

    assert reusable({"model_dir": str(model), "run_id": made_by}, "model_dir", inputs_for(store))
    assert reusable({"model_dir": str(model)}, "model_dir", inputs_for(store)), "no run to check"
    gone = {"model_dir": str(tmp_path / "cleaned"), "run_id": made_by}
    assert not reusable(gone, "model_dir", inputs_for(store))
    # a new tracking store (mlflow.db deleted, another server): the run it names is not there
    new_store = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert not reusable({"model_dir": str(model), "run_id": made_by}, "model_dir", inputs_for(new_store))
