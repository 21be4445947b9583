"""The service's training jobs through the real retraining flow (validation, DVC, gates, registry)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alignflow.data.demo import iter_demo_pairs
from alignflow.service.app import create_app
from alignflow.service.settings import ServiceSettings, TokenSpec
from flows.feedback_launcher import RetrainFlowLauncher
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


def test_feedback_trains_through_the_flow_and_lists_a_versioned_policy(tmp_path: Path):
    settings = ServiceSettings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        work_dir=tmp_path / "work",
        tokens=[TokenSpec(token=TOKEN, name="admin")],
    )
    launcher = RetrainFlowLauncher(
        settings, overrides=[*FAST_OVERRIDES, "promotion.min_win_rate_vs_reference=null"]
    )
    with TestClient(create_app(settings, launcher)) as client:
        for record in distinct_pairs(400):
            body = {k: record[k] for k in ("prompt", "chosen", "rejected")}
            assert (
                client.post("/api/policies/feedback/agent-7", json=body, headers=HEADERS).status_code == 201
            )
        started = client.post("/api/policies/train_policy/agent-7", json={}, headers=HEADERS)
        assert started.status_code == 202, started.text
        job = wait_for(client, started.json()["jobId"])
        assert job["status"] == "trained", job
        assert job["policyId"] == f"models:/agent-7-policy/{job['version'].removeprefix('v')}"
        assert job["feedbackCount"] == 400 and job["rewardModelPath"]
        listed = client.get("/api/policies/agent-7", headers=HEADERS).json()
    workspace = settings.work_dir / "agents" / "agent-7"
    assert (workspace / "data.dvc").exists(), "the feedback was versioned with DVC"
    assert (workspace / "data" / "manifest.json").exists()
    policies = listed["policies"] if isinstance(listed, dict) else listed
    assert policies and str(policies[0]["version"]).removeprefix("v") == job["version"].removeprefix("v")
