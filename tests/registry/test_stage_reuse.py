"""Finding the registered version a cached stage output was logged from, and showing a cache
hit under the pipeline run that reused it (real sqlite store)."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from alignflow.registry.lineage import (
    link_reused_version,
    producing_pipeline_run,
    stage_output_tags,
    version_from_stage,
)
from alignflow.registry.pipeline_record import (
    CACHE_HIT_TAG,
    REUSED_PIPELINE_TAG,
    REUSED_RUN_TAG,
    cache_hit_run,
)
from alignflow.registry.runs import child_runs, pipeline_run, stage_run


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


def test_a_cache_hit_shows_under_the_new_pipeline_run_and_points_at_the_run_that_did_the_work(
    tracking_uri, artifact_dir
):
    client = MlflowClient(tracking_uri)
    with (
        pipeline_run(tracking_uri, "p", artifact_location=artifact_dir) as producer,
        stage_run(tracking_uri, producer.info.run_id, "reward") as reward,
    ):
        pass
    with pipeline_run(tracking_uri, "p", artifact_location=artifact_dir) as rerun:
        figures = {"eval/accuracy": 0.9}
        hit = cache_hit_run(tracking_uri, rerun.info.run_id, "reward", reward.info.run_id, figures)
        with stage_run(tracking_uri, rerun.info.run_id, "data") as data:
            pass
        assert cache_hit_run(tracking_uri, rerun.info.run_id, "data", data.info.run_id) is None, "its own"
    (shown,) = [r for r in child_runs(tracking_uri, rerun.info.run_id) if r.info.run_name == "reward"]
    assert shown.info.run_id == hit
    tags = shown.data.tags
    assert tags[CACHE_HIT_TAG] == "true"
    assert tags[REUSED_RUN_TAG] == reward.info.run_id
    assert tags[REUSED_PIPELINE_TAG] == producer.info.run_id
    note = tags[MLFLOW_RUN_NOTE]
    experiment = producer.info.experiment_id
    assert f"(#/experiments/{experiment}/runs/{reward.info.run_id})" in note, note
    assert f"(#/experiments/{experiment}/runs/{producer.info.run_id})" in note, note
    assert shown.data.metrics == {"eval/accuracy": 0.9}, "the reused result's figures, side by side"

    with pipeline_run(tracking_uri, "p", artifact_location=artifact_dir) as third:
        again = cache_hit_run(tracking_uri, third.info.run_id, "reward", hit)
    assert client.get_run(again).data.tags[REUSED_RUN_TAG] == reward.info.run_id, "a hit of a hit"
