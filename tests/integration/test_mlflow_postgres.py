"""The retraining flow tracking into a real ``mlflow server`` on PostgreSQL (loopback only).

The server keeps runs and the registry in a fresh PostgreSQL database and serves the
artifacts itself (``--serve-artifacts``), the way a team's shared tracking server does.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from alignflow.registry.models import CHALLENGER, alias_version
from alignflow.registry.runs import DATA_VERSION_TAG, child_runs
from alignflow.registry.server import local_mlflow_server
from tests.integration.conftest import server_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TINY_RUN = [
    "project=pgdemo",
    "data.demo_rows=300",
    "data.demo_scored_rows=0",
    "sft.max_steps=10",
    "reward.max_steps=10",
    "dpo.max_steps=10",
    "evaluation.max_prompts=20",
    "evaluation.max_pairs=40",
    "evaluation.kl_samples=8",
    "evaluation.primary_judge=answer",
]


@pytest.fixture
def prefect_api(tmp_path):
    from alignflow.flows.environment import apply_defaults

    apply_defaults(tmp_path / "prefect-project")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_retrain_logs_and_registers_on_mlflow_server_with_postgres(
    postgres_url, fresh_database, prefect_api, tmp_path
):
    from alignflow.flows.retrain import retrain

    backend = server_url(postgres_url, fresh_database("alignflow_mlflow"), "psycopg")
    with local_mlflow_server(tmp_path / "mlflow", backend_store_uri=backend) as server:
        summary = retrain(None, [*TINY_RUN, f"tracking.uri={server.url}"], repo_dir=str(tmp_path / "repo"))

        client = MlflowClient(server.url)
        parent = client.get_run(summary["parent_run_id"])
        assert parent.data.tags[DATA_VERSION_TAG] == summary["data_version"]
        assert "summary.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}
        stages = {run.info.run_name: run for run in child_runs(server.url, parent.info.run_id)}
        assert {"data", "sft", "reward", "policy", "evaluate", "register", "promote"} <= set(stages)
        assert "sft/train_loss" in stages["sft"].data.metrics
        for role in ("policy", "reward"):
            version = alias_version(server.url, f"pgdemo-{role}", CHALLENGER)
            assert version == "1", role
            assert client.get_model_version(f"pgdemo-{role}", version).run_id
        # the runs really live in PostgreSQL and the artifacts under the server's folder
        assert server.backend_store_uri.startswith("postgresql+psycopg://")
        assert any(server.artifacts_destination.rglob("model.safetensors"))
