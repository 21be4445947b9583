"""Spec 002's HTTP snippets, run as written against a real server (only the import differs).

The server is ``alignflow api`` as a spec 002 client expects it: synchronous training
answers (``--wait-for-training``) and the library launcher, on a small pipeline config so
that the snippet's 1000 PPO steps take minutes, not hours.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alignflow.service.settings import ServiceSettings, TokenSpec

from .spec_http import requests

pytestmark = pytest.mark.slow
TOKEN = "spec-token-0123456789abcdef"
SMALL_MODEL = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "model.num_heads=2",
    "reward.max_steps=30",
    "reward.save_steps=1000",
    "ppo.per_device_train_batch_size=4",
    "ppo.mini_batch_size=4",
    "ppo.ppo_epochs=1",
    "ppo.max_new_tokens=4",
    "ppo.max_length=48",
    "ppo.save_steps=500",
    "ppo.logging_steps=50",
    "evaluation.max_new_tokens=4",
]


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory) -> Iterator[ServiceSettings]:
    import uvicorn

    from alignflow.service.app import create_app

    tmp = tmp_path_factory.mktemp("spec-server")
    settings = ServiceSettings(
        database_url=f"sqlite:///{tmp / 'service.db'}",
        tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}",
        work_dir=tmp / "work",
        tokens=[TokenSpec(token=TOKEN)],
        pipeline_overrides=SMALL_MODEL,
        training={"wait_by_default": True},
    )
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    requests.base_url, requests.token = f"http://127.0.0.1:{port}", TOKEN
    # the spec needs ten ratings before training; the first snippet adds one more
    for i in range(11):
        body = {
            "prompt": f"What is {i} plus {i + 2}?",
            "response": f"It is {2 * i + 2}.",
            "score": (i % 4) / 3,
        }
        assert (
            requests.post("http://localhost:8000/api/policies/feedback/my_agent", json=body).status_code
            == 201
        )
    yield settings
    server.should_exit = True
    thread.join(timeout=30)


# the snippets keep the spec's own layout
# fmt: off
def test_spec_snippets_collect_estimate_train_and_list(spec_server: ServiceSettings, capsys):
    # 1. Collect Feedback
    response = requests.post(
        "http://localhost:8000/api/policies/feedback/my_agent",
        json={
            "prompt": "What is the capital of France?",
            "response": "The capital of France is Paris.",
            "score": 0.9,  # Score between 0 (bad) and 1 (excellent)
            "runId": "execution_123",
            "notes": "Accurate and concise answer"
        }
    )
    assert response.status_code == 201 and response.json()["agentId"] == "my_agent"

    # 2. Estimate Training (Dry Run)
    response = requests.post(
        "http://localhost:8000/api/policies/train_policy/my_agent",
        json={
            "dryRun": True,
            "maxSteps": 1000,
            "learningRate": 1e-5
        }
    )

    estimate = response.json()
    print(f"Feedback count: {estimate['feedbackCount']}")
    print(f"Estimated time: {estimate['estimatedTimeMinutes']} minutes")
    print(f"Score mean: {estimate['scoreMean']}")
    assert estimate["feedbackCount"] == 12 and estimate["estimatedSteps"] == 1000

    # 3. Train Policy
    response = requests.post(
        "http://localhost:8000/api/policies/train_policy/my_agent",
        json={
            "dryRun": False,
            "maxSteps": 1000,
            "learningRate": 1e-5
        }
    )

    result = response.json()
    print(f"Policy ID: {result['policyId']}")
    print(f"Version: {result['version']}")
    print(f"Model path: {result['modelPath']}")
    print(f"Training steps: {result['trainingSteps']}")
    print(f"Final reward: {result['rewardMean']} ± {result['rewardStd']}")
    assert response.status_code == 200 and result["status"] == "trained", result
    assert result["trainingSteps"] == 1000 and result["feedbackCount"] == 12
    assert Path(result["modelPath"], "config.json").exists()
    assert Path(result["rewardModelPath"], "alignflow_reward.json").exists()

    # 4. List Trained Policies
    response = requests.get("http://localhost:8000/api/policies/my_agent")
    policies = response.json()

    for policy in policies:
        print(f"{policy['version']}: {policy['metrics']['rewardMean']:.3f}")

    printed = capsys.readouterr().out
    assert "Feedback count: 12" in printed and "Training steps: 1000" in printed
    assert f"{result['version']}: {result['rewardMean']:.3f}" in printed

    # Troubleshooting 3: review feedback scores
    response = requests.get("http://localhost:8000/api/policies/my_agent")
    policies = response.json()
    assert [p["version"] for p in policies] == [result["version"]]
    assert policies[0]["metrics"]["rewardStd"] == pytest.approx(result["rewardStd"])


# fmt: on
