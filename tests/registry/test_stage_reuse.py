"""Finding the registered version a cached stage output was logged from (real sqlite store)."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from alignflow.registry.lineage import (
    link_reused_version,
    producing_pipeline_run,
    stage_output_tags,
    version_from_stage,
)
from alignflow.registry.runs import pipeline_run, stage_run


def _version(client: MlflowClient, name: str, tags: dict[str, str], run_id: str | None = None) -> str:
    """A version registered straight from a local folder: its source does not matter here."""
    source = Path(client.tracking_uri.removeprefix("sqlite:///")).parent / "weights"
    return str(client.create_model_version(name, source=str(source), run_id=run_id, tags=tags).version)


def test_the_newest_version_from_that_stage_run_and_folder_is_found(tracking_uri):
    client = MlflowClient(tracking_uri)
    client.create_registered_model("p-reward")
    _version(client, "p-reward", stage_output_tags("/out/reward-a", "run1"))
    newest = _version(client, "p-reward", stage_output_tags("/out/reward-a", "run1"))
    _version(client, "p-reward", stage_output_tags("/out/reward-b", "run1"))  # another folder
    _version(client, "p-reward", stage_output_tags("/out/reward-a", "run2"))  # retrained
    found = version_from_stage(tracking_uri, "p-reward", "run1", "/out/reward-a")
    assert found is not None and str(found.version) == newest


def test_nothing_is_found_for_an_unregistered_output_or_a_missing_stage_run(tracking_uri):
    client = MlflowClient(tracking_uri)
    client.create_registered_model("p-reward")
    _version(client, "p-reward", stage_output_tags("/out/reward-a", "run1"))
    assert version_from_stage(tracking_uri, "p-reward", "run9", "/out/reward-a") is None
    assert version_from_stage(tracking_uri, "p-reward", None, "/out/reward-a") is None
    assert version_from_stage(tracking_uri, "p-policy", "run1", "/out/reward-a") is None
    assert "alignflow.trained_by_run" not in stage_output_tags("/out/x", None)


def test_a_reusing_run_links_to_the_pipeline_run_that_registered_the_version(tracking_uri, artifact_dir):
    client = MlflowClient(tracking_uri)
    client.create_registered_model("p-reward")
    with (
        pipeline_run(tracking_uri, "p", artifact_location=artifact_dir) as producer,
        stage_run(tracking_uri, producer.info.run_id, "register") as register,
    ):
        version = _version(client, "p-reward", {}, register.info.run_id)
    produced_by = producing_pipeline_run(tracking_uri, client.get_model_version("p-reward", version))
    assert produced_by == producer.info.run_id
    with pipeline_run(tracking_uri, "p", artifact_location=artifact_dir) as rerun:
        link_reused_version(tracking_uri, rerun.info.run_id, "reward", version, produced_by)
    tags = client.get_run(rerun.info.run_id).data.tags
    assert tags["reward.reused_from_run"] == producer.info.run_id
    assert tags["reward.reused_version"] == version
