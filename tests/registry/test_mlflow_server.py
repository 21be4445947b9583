"""Against a real ``mlflow server`` process over its REST API (loopback)."""

import mlflow
import pytest
from mlflow import MlflowClient

from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.registry import models, promotion, runs
from tests.registry.conftest import pinned_metrics


@pytest.mark.slow
def test_pipeline_runs_artifacts_and_both_models_over_rest(
    mlflow_server, tiny_model_dir, reward_model_dir, tmp_path
):
    uri = mlflow_server.url
    tags = runs.lineage_tags("md5-data", "cfg-hash", repo=tmp_path)
    report = tmp_path / "eval_report.json"
    report.write_text('{"eval/win_rate_vs_reference": 0.8}')
    logged = {}
    with runs.pipeline_run(uri, "alignflow-demo", "retrain", tags) as parent:
        with runs.stage_run(uri, parent.info.run_id, "reward"):
            mlflow.log_metric("eval/reward_accuracy", 0.9)
            logged["reward"] = models.log_model(
                reward_model_dir, uri, models.registered_name("demo", "reward")
            )
        with runs.stage_run(uri, parent.info.run_id, "policy"):
            logged["policy"] = models.log_model(tiny_model_dir, uri, models.registered_name("demo", "policy"))
        with runs.stage_run(uri, parent.info.run_id, "evaluate"):
            mlflow.log_artifact(str(report), "reports")

    client = MlflowClient(uri)
    children = runs.child_runs(uri, parent.info.run_id)
    assert sorted(r.data.tags[runs.STAGE_TAG] for r in children) == ["evaluate", "policy", "reward"]
    assert all(
        r.data.tags["data.version"] == "md5-data" for r in [client.get_run(parent.info.run_id), *children]
    )
    evaluate_run = next(r for r in children if r.data.tags[runs.STAGE_TAG] == "evaluate")
    assert [a.path for a in client.list_artifacts(evaluate_run.info.run_id, "reports")] == [
        "reports/eval_report.json"
    ]
    assert any(mlflow_server.artifacts_destination.rglob("eval_report.json"))

    accuracy = pinned_metrics(reward_accuracy=(0.9, 0.85, 0.94, 200))
    promotion.promote(uri, "demo-reward", logged["reward"].version, accuracy, PromotionConfig(), "reward")
    assert models.alias_version(uri, "demo-reward", models.CHAMPION) == logged["reward"].version
    for role, kind in (("reward", "text-classification"), ("policy", "text-generation")):
        name = f"demo-{role}"
        version = client.get_model_version(name, logged[role].version)
        assert models.CHALLENGER in version.aliases
        assert version.tags[models.MODEL_KIND_TAG] == kind
    reward = models.load_components(uri, "demo-reward", models.CHAMPION)
    assert reward["model"].config.num_labels == 1
