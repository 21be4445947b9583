"""The version page says which step of the policy stage was handed on, read from the stage run."""

from __future__ import annotations

import mlflow

from alignflow.registry.promotion import handed_on_said
from alignflow.registry.runs import STAGE_TAG


def pipeline_with_policy_stage(tmp_path, metrics: dict[str, float]) -> tuple[str, str]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    parent = client.create_run(experiment).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": parent, STAGE_TAG: "policy"})
    for key, value in metrics.items():
        client.log_metric(child.info.run_id, key, value)
    return uri, parent


def test_the_handed_on_step_and_the_steps_run_come_from_the_policy_stage_run(tmp_path):
    uri, parent = pipeline_with_policy_stage(tmp_path, {"ppo/handed_on_step": 8.0, "ppo/global_step": 16.0})
    said = handed_on_said(uri, parent)
    assert said is not None and said.startswith("Handed on: step 8 of 16 of the policy stage;")


def test_the_start_handed_on_is_called_so_and_no_curve_says_nothing(tmp_path):
    uri, parent = pipeline_with_policy_stage(tmp_path / "a", {"handed_on_step": 0.0, "global_step": 4.0})
    assert "step 0 of 4 of the policy stage (the start: no later step beat it)" in (
        handed_on_said(uri, parent) or ""
    )
    uri, parent = pipeline_with_policy_stage(tmp_path / "b", {"global_step": 4.0})
    assert handed_on_said(uri, parent) is None
