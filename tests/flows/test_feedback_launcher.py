"""The service's training jobs through the real retraining flow (validation, DVC, gates, registry)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alignflow.data.demo import iter_demo_pairs
from alignflow.flows.feedback_launcher import RetrainFlowLauncher
from alignflow.registry.runs import child_runs
from alignflow.service.app import create_app
from alignflow.service.settings import ServiceSettings, TokenSpec
from tests.flows.conftest import FAST_OVERRIDES

pytestmark = pytest.mark.slow
TOKEN = "flow-token-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def distinct_pairs(n: int) -> list[dict]:
    seen, kept = set(), []
    for record in iter_demo_pairs(n * 10, seed=3):
        key = (record["prompt"], record["chosen"], record["rejected"])
        if key not in seen:
            seen.add(key)
            kept.append(record)
        if len(kept) == n:
            break
    return kept


def wait_for(client: TestClient, job_id: str, timeout: float = 900.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/policies/jobs/{job_id}", headers=HEADERS).json()
        if job["status"] in ("trained", "failed"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still running after {timeout}s")


def service_settings(tmp_path: Path) -> ServiceSettings:
    return ServiceSettings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        work_dir=tmp_path / "work",
        tokens=[TokenSpec(token=TOKEN, name="admin")],
    )


def test_feedback_trains_through_the_flow_and_lists_a_versioned_policy(tmp_path: Path):
    settings = service_settings(tmp_path)
    # the demo feedback holds out 25 distinct prompts: let that count as evidence here
    gates = ["promotion.min_win_rate_vs_reference=null", "promotion.min_judged_rows=20"]
    launcher = RetrainFlowLauncher(settings, overrides=[*FAST_OVERRIDES, *gates])
    pairs = distinct_pairs(520)
    with TestClient(create_app(settings, launcher)) as client:
        for record in pairs[:400]:
            body = {k: record[k] for k in ("prompt", "chosen", "rejected")}
            assert (
                client.post("/api/policies/feedback/agent-7", json=body, headers=HEADERS).status_code == 201
            )
        started = client.post("/api/policies/train_policy/agent-7", json={}, headers=HEADERS)
        assert started.status_code == 202, started.text
        job = wait_for(client, started.json()["jobId"])
        assert job["status"] == "trained", job
        assert job["policyId"] == f"models:/agent-7-policy/{job['version'].removeprefix('v')}"
        assert job["feedbackCount"] == 400
        assert (Path(job["modelPath"]) / "config.json").exists()
        assert (Path(job["rewardModelPath"]) / "alignflow_reward.json").exists()
        listed = client.get("/api/policies/agent-7", headers=HEADERS).json()
        workspace = settings.work_dir / "agents" / "agent-7"
        assert (workspace / "data.dvc").exists(), "the feedback was versioned with DVC"
        assert (workspace / "data" / "manifest.json").exists()
        assert listed and listed[0]["version"] == job["version"]
        assert {"rewardMean", "rewardStd", "feedbackCount"} <= set(listed[0]["metrics"])

        # incremental: more feedback trains a new version that meets the gates against the champion
        for record in pairs[400:]:
            body = {k: record[k] for k in ("prompt", "chosen", "rejected")}
            assert (
                client.post("/api/policies/feedback/agent-7", json=body, headers=HEADERS).status_code == 201
            )
        answer = client.post("/api/policies/train_policy/agent-7?wait=true", json={}, headers=HEADERS)
        assert answer.status_code == 200, answer.text
        second = answer.json()
        policies = client.get("/api/policies/agent-7", headers=HEADERS).json()
    assert second["version"] != job["version"] and second["feedbackCount"] == 520
    assert [p["version"] for p in policies] == [second["version"], job["version"]]
    champions = [p["version"] for p in policies if "champion" in p["aliases"]]
    assert champions == [second["version"] if second["promoted"] else job["version"]], policies
    from mlflow import MlflowClient

    number = second["version"].removeprefix("v")
    tags = MlflowClient(settings.tracking_uri).get_model_version("agent-7-policy", number).tags
    assert tags["promotion.decision"] == ("promoted" if second["promoted"] else "rejected"), tags


def spec_scored_feedback(n: int) -> list[dict]:
    """Spec 002's feedback: one response per prompt, a score in [0, 1]; no pair anywhere."""
    return [
        {
            "prompt": f"What is {i} plus {i + 2}?",
            "response": f"The answer is {2 * i + 2}." if i % 3 else "I do not know.",
            "score": 0.9 if i % 3 else 0.1,
        }
        for i in range(n)
    ]


SMALL_PPO = [
    "reward.max_steps=30",
    "reward.save_steps=1000",
    "ppo.per_device_train_batch_size=8",
    "ppo.mini_batch_size=8",
    "ppo.ppo_epochs=1",
    "ppo.max_new_tokens=6",
    "ppo.max_length=64",
    "evaluation.max_new_tokens=6",
    "evaluation.kl_samples=4",
]


def test_ratings_alone_train_a_regression_reward_model_and_ppo_and_report_what_ran(tmp_path: Path):
    from mlflow import MlflowClient

    settings = service_settings(tmp_path)
    launcher = RetrainFlowLauncher(settings, overrides=SMALL_PPO)
    with TestClient(create_app(settings, launcher)) as client:
        for body in spec_scored_feedback(12):
            assert client.post("/api/policies/feedback/rated", json=body, headers=HEADERS).status_code == 201
        dry = client.post("/api/policies/train_policy/rated", json={"dryRun": True}, headers=HEADERS).json()
        assert dry["modelConfig"]["algorithm"] == "ppo" and dry["modelConfig"]["reward_mode"] == "regression"
        answer = client.post(
            "/api/policies/train_policy/rated?wait=true", json={"maxSteps": 6}, headers=HEADERS
        )
        assert answer.status_code == 200, answer.text
        trained = answer.json()
        listed = client.get("/api/policies/rated", headers=HEADERS).json()
    assert trained["status"] == "trained" and trained["trainingSteps"] == 6
    assert isinstance(trained["rewardMean"], float) and isinstance(trained["rewardStd"], float)

    mlflow = MlflowClient(settings.tracking_uri)
    (parent,) = mlflow.search_runs(
        [e.experiment_id for e in mlflow.search_experiments()],
        filter_string=f"tags.job_id = '{trained['jobId']}' and tags.`alignflow.pipeline` = 'retrain'",
    )
    stages = {
        r.data.tags.get("mlflow.runName"): r for r in child_runs(settings.tracking_uri, parent.info.run_id)
    }
    reward_params = stages["reward"].data.params
    assert "regression" in reward_params.get("reward", reward_params.get("reward.mode", "")), reward_params
    steps = mlflow.get_metric_history(stages["policy"].info.run_id, "train/iteration_seconds")
    assert [m.step for m in steps] == list(range(1, 7)), "the policy run logged every step that ran"

    (policy,) = listed
    assert policy["version"] == trained["version"]
    metrics = policy["metrics"]
    assert metrics["trainingSteps"] == 6 and metrics["feedbackCount"] == 12
    assert metrics["rewardMean"] == pytest.approx(trained["rewardMean"])
    assert metrics["rewardStd"] == pytest.approx(trained["rewardStd"])
