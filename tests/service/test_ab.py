"""A/B from live feedback: champion and challenger served side by side, each rating tied to
the version that wrote the response, and the human gate deciding on what people said."""

from __future__ import annotations

import random
from pathlib import Path

import mlflow
import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient
from typer.testing import CliRunner

from alignflow.cli import app as cli
from alignflow.registry import models, promotion
from alignflow.service.ab import CHALLENGER, CHAMPION, assign_arm, hashed_user
from alignflow.service.app import create_app
from alignflow.service.settings import ServiceSettings, TokenSpec

pytestmark = pytest.mark.slow
TOKEN = "ab-token-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
AGENT = "shop"


@pytest.fixture
def two_versions(tmp_path: Path, tiny_model_dir: Path) -> str:
    """``shop-policy`` v1 (champion) and v2 (challenger) in a fresh MLflow store; returns its URI."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("ab", artifact_location=(tmp_path / "art").as_uri())
    name = models.registered_name(AGENT, "policy")
    with mlflow.start_run(experiment_id=experiment):
        first = models.log_model(tiny_model_dir, uri, name, tags={"agent_id": AGENT})
    # v2: the same weights, a new version (the simulated users tell them apart by version)
    models.register(uri, first.model_uri, name, first.run_id, tags={"agent_id": AGENT})
    promotion.set_champion(uri, name, first.version, "the first policy")
    mlflow.set_tracking_uri(None)
    return uri


def service(tmp_path: Path, uri: str) -> TestClient:
    settings = ServiceSettings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        tracking_uri=uri,
        work_dir=tmp_path / "work",
        tokens=[TokenSpec(token=TOKEN)],
        serving={"max_new_tokens": 6},
    )
    return TestClient(create_app(settings))


def simulate_users(client: TestClient, better: str, users: int = 80, seed: int = 0) -> dict[str, str]:
    """Each user asks once and rates the answer: the ``better`` version's answers rate higher."""
    rng = random.Random(seed)
    served = {}
    for i in range(users):
        key = f"user-{i}"
        answer = client.post(
            f"/api/policies/generate/{AGENT}",
            json={"prompt": "What is 2 plus 3?", "userKey": key},
            headers=HEADERS,
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        served[key] = body["policyVersion"]
        mean = 0.75 if body["policyVersion"] == better else 0.55
        score = min(1.0, max(0.0, rng.gauss(mean, 0.12)))
        rating = {"prompt": "What is 2 plus 3?", "response": body["completion"] or "-", "score": score}
        rating["runId"] = body["runId"]
        assert client.post(f"/api/policies/feedback/{AGENT}", json=rating, headers=HEADERS).status_code == 201
    return served


@pytest.mark.parametrize("better", ["v2", "v1"], ids=["challenger-better", "champion-better"])
def test_the_human_gate_promotes_the_better_version_and_never_the_worse(tmp_path, two_versions, better):
    uri = two_versions
    with service(tmp_path, uri) as client:
        split = client.put(f"/api/policies/traffic/{AGENT}", json={"challengerShare": 0.5}, headers=HEADERS)
        assert split.json()["championVersion"] == "v1" and split.json()["challengerVersion"] == "v2"
        served = simulate_users(client, better)
        # sticky: a user asking again is served by the same version
        again = client.post(
            f"/api/policies/generate/{AGENT}", json={"prompt": "Hello?", "userKey": "user-7"}, headers=HEADERS
        )
        assert again.json()["policyVersion"] == served["user-7"]
        listed = {
            p["version"]: p["online"] for p in client.get(f"/api/policies/{AGENT}", headers=HEADERS).json()
        }
    counts = {v: list(served.values()).count(v) for v in ("v1", "v2")}
    assert min(counts.values()) >= 25, counts  # about half each
    assert listed["v1"]["count"] == counts["v1"] and listed["v2"]["count"] == counts["v2"]
    assert listed[better]["meanScore"] > listed["v2" if better == "v1" else "v1"]["meanScore"]
    assert all(o["low"] <= o["meanScore"] <= o["high"] for o in listed.values())

    result = CliRunner().invoke(
        cli,
        [
            "promote", "--human", "--agent", AGENT, "--tracking-uri", uri,
            "--db-url", f"sqlite:///{tmp_path / 'service.db'}", "--set", "promotion.min_judged_rows=20",
        ],
    )  # fmt: skip
    name = models.registered_name(AGENT, "policy")
    champion = models.alias_version(uri, name, models.CHAMPION)
    tags = MlflowClient(uri).get_model_version(name, "2").tags
    if better == "v2":
        assert result.exit_code == 0, result.output
        assert champion == "2" and tags["promotion.decision"] == "promoted"
    else:
        assert result.exit_code == 1, result.output
        assert champion == "1" and tags["promotion.decision"] == "rejected"
        assert "human_score_gain" in tags["promotion.failed_gates"]
    assert "judges that count: human" in result.output and tags["promotion.judges"] == "human"
    assert "promotion.gate.human_score_gain" in tags


def test_split_assignment_and_attribution_survive_a_restart(tmp_path, two_versions):
    uri = two_versions
    with service(tmp_path, uri) as first:
        assert first.get(f"/api/policies/traffic/{AGENT}", headers=HEADERS).json()["challengerShare"] == 0.0
        first.put(f"/api/policies/traffic/{AGENT}", json={"challengerShare": 0.3}, headers=HEADERS)
        served = simulate_users(first, better="v1", users=30)
        before = {
            p["version"]: p["online"] for p in first.get(f"/api/policies/{AGENT}", headers=HEADERS).json()
        }
    with service(tmp_path, uri) as second:  # a new process on the same database
        assert second.get(f"/api/policies/traffic/{AGENT}", headers=HEADERS).json()["challengerShare"] == 0.3
        for key in ("user-0", "user-1", "user-2", "user-3"):
            answer = second.post(
                f"/api/policies/generate/{AGENT}", json={"prompt": "Hi?", "userKey": key}, headers=HEADERS
            ).json()
            assert answer["policyVersion"] == served[key]
        after = {
            p["version"]: p["online"] for p in second.get(f"/api/policies/{AGENT}", headers=HEADERS).json()
        }
    assert after == before


def test_assignment_is_sticky_monotone_and_respects_the_share():
    keys = [hashed_user(AGENT, f"u{i}") for i in range(2000)]
    at_30 = [assign_arm(k, 0.3) for k in keys]
    at_60 = [assign_arm(k, 0.6) for k in keys]
    assert abs(at_30.count(CHALLENGER) / len(keys) - 0.3) < 0.04
    # raising the share only moves champion users over
    assert all(b == CHALLENGER for a, b in zip(at_30, at_60, strict=True) if a == CHALLENGER)
    assert {assign_arm(k, 0.0) for k in keys} == {CHAMPION} and {assign_arm(k, 1.0) for k in keys} == {
        CHALLENGER
    }
    assert hashed_user(AGENT, "u1") != hashed_user("other", "u1")  # per agent, and never the raw key


def test_retraining_data_records_which_version_wrote_each_rated_response(tmp_path, two_versions):
    import json

    from alignflow.data.normalize import normalize_row
    from alignflow.service.jobs import export_feedback

    with service(tmp_path, two_versions) as client:
        client.put(f"/api/policies/traffic/{AGENT}", json={"challengerShare": 0.5}, headers=HEADERS)
        served = simulate_users(client, better="v2", users=12)
        unrelated = {"prompt": "Q?", "response": "A.", "score": 0.5, "runId": "written-elsewhere"}
        client.post(f"/api/policies/feedback/{AGENT}", json=unrelated, headers=HEADERS)
        count, _ = export_feedback(client.app.state.store, AGENT, tmp_path / "export.jsonl")
    rows = [normalize_row(json.loads(line)) for line in (tmp_path / "export.jsonl").read_text().splitlines()]
    assert count == 13 and len(rows) == 13
    versions = [r["metadata"].get("policy_version") for r in rows]
    assert sorted(f"v{v}" for v in versions if v) == sorted(served.values())
    assert versions.count(None) == 1  # a runId this service never served names no version
