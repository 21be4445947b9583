"""Training through the API: export, job lifecycle, a real tiny model registered in MLflow, listing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from alignflow.data.demo import iter_demo_pairs, iter_demo_scored
from alignflow.service.jobs import TrainingOutcome, TrainingRequest
from alignflow.service.local_launcher import LocalTrainingLauncher

from .conftest import SCOPED, auth

FEEDBACK = "/api/policies/feedback/{}"
TRAIN = "/api/policies/train_policy/{}"


def submit_demo_feedback(client, agent_id: str, pairs: int, scored: int) -> None:
    for r in iter_demo_pairs(pairs, seed=1):
        body = {"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
        assert client.post(FEEDBACK.format(agent_id), json=body, headers=auth()).status_code == 201
    for r in iter_demo_scored(scored, seed=2):
        body = {"prompt": r["prompt"], "response": r["response"], "score": r["score"]}
        assert client.post(FEEDBACK.format(agent_id), json=body, headers=auth()).status_code == 201


def wait_for_job(client, job_id: str, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/policies/jobs/{job_id}", headers=auth()).json()
        if job["status"] in ("trained", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish in {timeout}s")


class GatedLauncher:
    """A stand-in launcher that waits for the test and records what it was given."""

    def __init__(self, fail: bool = False):
        self.release = threading.Event()
        self.requests: list[TrainingRequest] = []
        self.fail = fail

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        self.requests.append(request)
        self.release.wait(30)
        if self.fail:
            raise ValueError("reward stage diverged\n  File secret.py, line 3")
        return TrainingOutcome(
            policy_id="p",
            version="v1",
            model_path="/m",
            feedback_count=request.feedback_count,
            training_steps=request.max_steps,
            reward_mean=0.5,
            reward_std=0.1,
        )


def test_a_job_exports_the_feedback_and_reports_its_lifecycle(make_client):
    launcher = GatedLauncher()
    client = make_client(launcher)
    submit_demo_feedback(client, "agent-a", pairs=6, scored=6)

    accepted = client.post(TRAIN.format("agent-a"), json={"maxSteps": 7}, headers=auth())
    assert accepted.status_code == 202, accepted.text
    job = accepted.json()
    assert job["status"] in ("queued", "running") and job["feedbackCount"] == 12
    assert accepted.headers["location"] == f"/api/policies/jobs/{job['jobId']}"
    # one job at a time per agent
    assert client.post(TRAIN.format("agent-a"), json={}, headers=auth()).status_code == 409
    # another agent's token cannot read the job
    assert client.get(f"/api/policies/jobs/{job['jobId']}", headers=auth(SCOPED)).status_code == 403

    launcher.release.set()
    done = wait_for_job(client, job["jobId"])
    assert done["status"] == "trained" and done["trainingSteps"] == 7 and done["rewardMean"] == 0.5

    request = launcher.requests[0]
    lines = [json.loads(line) for line in Path(request.dataset_path).read_text().splitlines()]
    assert len(lines) == 12
    assert sum("chosen" in r for r in lines) == 6 and sum("score" in r for r in lines) == 6
    assert all(r["metadata"]["agent_id"] == "agent-a" for r in lines)
    assert {r["prompt"] for r in lines} == {r["prompt"] for r in iter_demo_pairs(6, seed=1)} | {
        r["prompt"] for r in iter_demo_scored(6, seed=2)
    }


def test_a_failing_job_is_reported_without_a_traceback(make_client):
    launcher = GatedLauncher(fail=True)
    launcher.release.set()
    client = make_client(launcher)
    submit_demo_feedback(client, "agent-b", pairs=10, scored=0)
    job = client.post(TRAIN.format("agent-b"), json={}, headers=auth()).json()
    done = wait_for_job(client, job["jobId"])
    assert done["status"] == "failed"
    assert done["error"] == "ValueError: reward stage diverged"
    assert client.get("/api/policies/jobs/" + "f" * 32, headers=auth()).status_code == 404


def test_unfinished_jobs_of_a_previous_process_are_marked_failed(make_client):
    launcher = GatedLauncher()
    first = make_client(launcher)
    submit_demo_feedback(first, "agent-c", pairs=10, scored=0)
    job = first.post(TRAIN.format("agent-c"), json={}, headers=auth()).json()
    second = make_client(GatedLauncher())  # a restart on the same database
    launcher.release.set()
    status = second.get(f"/api/policies/jobs/{job['jobId']}", headers=auth()).json()
    assert status["status"] == "failed" and "restarted" in status["error"]


@pytest.mark.slow
def test_training_a_tiny_policy_registers_it_and_lists_it_newest_first(make_client, make_settings):
    settings = make_settings()
    launcher = LocalTrainingLauncher(
        settings.tracking_uri,
        config_overrides=[  # small and quick; the request's maxSteps still has the last word
            "reward.max_steps=10",
            "reward.save_steps=1000",
            "reward.per_device_train_batch_size=8",
            "ppo.per_device_train_batch_size=8",
            "ppo.mini_batch_size=8",
            "ppo.ppo_epochs=1",
            "ppo.max_new_tokens=4",
            "ppo.max_length=64",
            "evaluation.max_new_tokens=4",
            "evaluation.max_prompts=8",
        ],
    )
    client = make_client(launcher)
    submit_demo_feedback(client, "agent-d", pairs=40, scored=20)
    assert client.get("/api/policies/agent-d", headers=auth()).json() == []

    versions = []
    for steps in (4, 6):
        accepted = client.post(
            TRAIN.format("agent-d"), json={"maxSteps": steps, "learningRate": 1e-3}, headers=auth()
        )
        assert accepted.status_code == 202, accepted.text
        done = wait_for_job(client, accepted.json()["jobId"])
        assert done["status"] == "trained", done
        # ratings and comparisons: a mixed reward model and PPO, steps as the trainer counted them
        assert done["feedbackCount"] == 60 and done["trainingSteps"] == steps
        assert isinstance(done["rewardMean"], float) and done["rewardStd"] >= 0.0
        assert (Path(done["rewardModelPath"]) / "alignflow_reward.json").exists()
        assert (Path(done["modelPath"]) / "config.json").exists()
        assert Path(done["modelPath"]).is_relative_to(settings.models_dir.resolve())
        versions.append(done["version"])
    assert versions == ["v1", "v2"]

    policies = client.get("/api/policies/agent-d", headers=auth()).json()
    assert [p["version"] for p in policies] == ["v2", "v1"]
    newest = policies[0]
    assert newest["agentId"] == "agent-d" and newest["id"] == "models:/agent-d-policy/2"
    assert newest["metrics"]["feedbackCount"] == 60 and newest["metrics"]["trainingSteps"] == 6
    assert all(isinstance(p["metrics"][k], float) for p in policies for k in ("rewardMean", "rewardStd"))
    assert "challenger" in newest["aliases"]
    # another agent sees none of them
    assert client.get("/api/policies/agent-e", headers=auth()).json() == []
