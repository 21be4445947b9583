"""Logging and fetching registered models: what is saved beside the weights comes back too."""

import json
import shutil

import mlflow
from mlflow import MlflowClient

from alignflow.registry import models


def test_a_downloaded_version_keeps_the_sidecar_files_saved_beside_its_weights(tmp_path, tiny_model_dir):
    model_dir = tmp_path / "reward-like"
    shutil.copytree(tiny_model_dir, model_dir)
    meta = {"mean": 1.5, "std": 0.25, "objectives": ["helpful"], "pooling": "mean"}
    (model_dir / "alignflow_reward.json").write_text(json.dumps(meta))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = models.log_model(model_dir, uri, "demo-reward")
    fetched = models.download_model_dir(uri, logged.name, models.CHALLENGER, tmp_path / "fetched")
    assert json.loads((fetched / "alignflow_reward.json").read_text()) == meta
    by_number = models.download_model_dir(uri, logged.name, logged.version, tmp_path / "by-number")
    assert json.loads((by_number / "alignflow_reward.json").read_text()) == meta
    plain = models.download_model_dir(uri, logged.name, logged.version, tmp_path / "again")
    assert (plain / "config.json").exists()
