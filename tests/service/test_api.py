"""The HTTP API on SQLite and on a real PostgreSQL server: feedback, dry runs, security, errors."""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from alignflow.data.demo import iter_demo_pairs, iter_demo_scored

from .conftest import SCOPED, SCOPED_AGENT, auth

FEEDBACK = "/api/policies/feedback/{}"
TRAIN = "/api/policies/train_policy/{}"


def scored_bodies(n: int, seed: int = 0) -> list[dict]:
    return [
        {"prompt": r["prompt"], "response": r["response"], "score": r["score"], "runId": f"run-{i}"}
        for i, r in enumerate(iter_demo_scored(n, seed=seed))
    ]


def pair_bodies(n: int, seed: int = 0) -> list[dict]:
    return [
        {"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
        for r in iter_demo_pairs(n, seed)
    ]


def rows(client, agent_id: str) -> list[dict]:
    with client.app.state.engine.connect() as conn:
        result = conn.execute(
            sa.text("SELECT * FROM feedback WHERE agent_id = :a ORDER BY created_at"), {"a": agent_id}
        )
        return [dict(r._mapping) for r in result]


def test_scored_and_pairwise_feedback_are_stored_as_sent(client):
    scored = {
        "prompt": "What is 2 plus 2?",
        "response": "The answer is 4.",
        "score": 0.9,
        "runId": "exec-1",
        "notes": "right and short",
    }
    pair = {"prompt": "What is 1 plus 2?", "chosen": "The answer is 3.", "rejected": "4"}
    first = client.post(FEEDBACK.format("agent-1"), json=scored, headers=auth())
    second = client.post(FEEDBACK.format("agent-1"), json=pair, headers=auth())

    assert first.status_code == 201, first.text
    body = first.json()
    assert set(body) >= {"id", "agentId", "score", "createdAt"}
    assert body["agentId"] == "agent-1" and body["score"] == 0.9 and body["kind"] == "scored"
    assert body["createdAt"].endswith("Z")
    assert (
        second.status_code == 201 and second.json()["kind"] == "pairwise" and second.json()["score"] is None
    )
    stored = rows(client, "agent-1")
    assert [r["kind"] for r in stored] == ["scored", "pairwise"]
    assert (stored[0]["prompt"], stored[0]["response"], stored[0]["score"]) == (
        scored["prompt"],
        scored["response"],
        0.9,
    )
    assert (stored[0]["run_id"], stored[0]["notes"]) == ("exec-1", "right and short")
    assert (stored[1]["chosen"], stored[1]["rejected"]) == ("The answer is 3.", "4")


def test_dry_run_reports_counts_and_score_moments(client):
    bodies = scored_bodies(12) + pair_bodies(3)
    for body in bodies:
        assert client.post(FEEDBACK.format("agent-2"), json=body, headers=auth()).status_code == 201
    response = client.post(
        TRAIN.format("agent-2"), json={"dryRun": True, "maxSteps": 40, "learningRate": 1e-5}, headers=auth()
    )

    assert response.status_code == 200, response.text
    estimate = response.json()
    scores = [b["score"] for b in bodies if "score" in b]
    assert estimate["status"] == "dry_run"
    assert estimate["feedbackCount"] == 15
    assert estimate["estimatedSteps"] == 40
    assert estimate["estimatedTimeMinutes"] > 0
    assert estimate["scoreMean"] == pytest.approx(statistics.fmean(scores))
    assert estimate["scoreStd"] == pytest.approx(statistics.pstdev(scores))
    assert estimate["modelConfig"]["learning_rate"] == 1e-5
    assert estimate["modelConfig"]["max_steps"] == 40
    # a dry run starts nothing
    with client.app.state.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar() == 0


def test_training_needs_the_minimum_feedback(make_client):
    client = make_client(min_feedback=5)
    for body in scored_bodies(4):
        client.post(FEEDBACK.format("agent-3"), json=body, headers=auth())
    for payload in ({"dryRun": True}, {"dryRun": False}):
        response = client.post(TRAIN.format("agent-3"), json=payload, headers=auth())
        assert response.status_code == 400
        assert "4 feedback samples" in response.json()["detail"] and "at least 5" in response.json()["detail"]
    client.post(FEEDBACK.format("agent-3"), json=scored_bodies(1, seed=9)[0], headers=auth())
    assert client.post(TRAIN.format("agent-3"), json={"dryRun": True}, headers=auth()).status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", FEEDBACK.format("a1")),
        ("post", TRAIN.format("a1")),
        ("get", "/api/policies/a1"),
        ("get", "/api/policies/jobs/" + "0" * 32),
    ],
)
def test_requests_without_a_valid_token_get_401(client, method, path):
    kwargs = {"json": scored_bodies(1)[0]} if method == "post" else {}
    missing = getattr(client, method)(path, **kwargs)
    wrong = getattr(client, method)(path, headers=auth("not-a-token-at-all-xxxxxx"), **kwargs)
    basic = getattr(client, method)(path, headers={"Authorization": "Basic dXNlcjpwYXNz"}, **kwargs)
    for response in (missing, wrong, basic):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"


def test_a_token_scoped_to_another_agent_gets_403(client):
    body = scored_bodies(1)[0]
    assert client.post(FEEDBACK.format("agent-x"), json=body, headers=auth(SCOPED)).status_code == 403
    assert (
        client.post(TRAIN.format("agent-x"), json={"dryRun": True}, headers=auth(SCOPED)).status_code == 403
    )
    assert client.get("/api/policies/agent-x", headers=auth(SCOPED)).status_code == 403
    assert client.post(FEEDBACK.format(SCOPED_AGENT), json=body, headers=auth(SCOPED)).status_code == 201
    assert rows(client, "agent-x") == []


@pytest.mark.parametrize(
    "agent_id",
    [
        "..%2F..%2Fetc%2Fpasswd",
        "%2E%2E",
        "a%2F..%2Fb",
        ".hidden",
        "agent.v1",
        "a b",
        "x" * 65,
        "-lead",
        "agent%00",
        "%2Fabs",
    ],
)
def test_traversal_shaped_agent_ids_get_422(client, agent_id):
    body = scored_bodies(1)[0]
    for response in (
        client.post(FEEDBACK.format(agent_id), json=body, headers=auth()),
        client.post(TRAIN.format(agent_id), json={"dryRun": True}, headers=auth()),
        client.get(f"/api/policies/{agent_id}", headers=auth()),
    ):
        assert response.status_code == 422, (agent_id, response.status_code, response.text)
        assert "agent_id" in response.json()["detail"]
    assert client.app.state.store.count_feedback() == 0


def raw_request(app, method: str, path: str, body: bytes = b"") -> int:
    """Send a path exactly as written (HTTP clients would collapse '..' segments before sending)."""
    import anyio

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"authorization", auth()["Authorization"].encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
    }
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    anyio.run(app, scope, receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


@pytest.mark.parametrize("agent_id", ["..", "../../etc/passwd", "a/../../b", "./x"])
def test_literal_dot_segments_get_422(client, agent_id):
    body = b'{"prompt": "p", "response": "r", "score": 0.5}'
    assert raw_request(client.app, "POST", f"/api/policies/feedback/{agent_id}", body) == 422
    assert raw_request(client.app, "POST", f"/api/policies/train_policy/{agent_id}", b"{}") == 422
    assert raw_request(client.app, "GET", f"/api/policies/{agent_id}") == 422
    assert client.app.state.store.count_feedback() == 0


def test_a_retried_post_with_the_same_idempotency_key_is_stored_once(client):
    body = scored_bodies(1)[0]
    headers = {**auth(), "Idempotency-Key": "retry-0001"}
    responses = [client.post(FEEDBACK.format("agent-4"), json=body, headers=headers) for _ in range(3)]
    assert [r.status_code for r in responses] == [201, 200, 200]
    assert len({r.json()["id"] for r in responses}) == 1
    assert responses[1].headers["idempotent-replayed"] == "true"
    # the same key for another agent is a different request
    other = client.post(FEEDBACK.format("agent-5"), json=body, headers=headers)
    assert other.status_code == 201
    assert len(rows(client, "agent-4")) == 1 and len(rows(client, "agent-5")) == 1


def test_concurrent_retries_with_one_key_store_one_row(client):
    body = scored_bodies(1)[0]
    headers = {**auth(), "Idempotency-Key": "race-key"}
    with ThreadPoolExecutor(8) as pool:
        codes = list(
            pool.map(
                lambda _: client.post(FEEDBACK.format("agent-6"), json=body, headers=headers).status_code,
                range(16),
            )
        )
    assert sorted(set(codes)) in ([200, 201], [201])
    assert codes.count(201) == 1
    assert len(rows(client, "agent-6")) == 1


def test_reusing_a_key_for_a_different_body_is_a_conflict(client):
    headers = {**auth(), "Idempotency-Key": "key-7"}
    first, second = scored_bodies(2)
    assert client.post(FEEDBACK.format("agent-7"), json=first, headers=headers).status_code == 201
    conflict = client.post(FEEDBACK.format("agent-7"), json=second, headers=headers)
    assert conflict.status_code == 409
    assert len(rows(client, "agent-7")) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "p", "response": "r", "score": 1.5}, "body.score"),
        ({"prompt": "p", "response": "r", "score": -0.1}, "body.score"),
        ({"prompt": "p", "response": "r"}, "body.score"),
        ({"prompt": "p", "score": 0.5}, "body.response"),
        ({"response": "r", "score": 0.5}, "body.prompt"),
        ({"prompt": "p", "chosen": "c"}, "body.rejected"),
        ({"prompt": "", "response": "r", "score": 0.5}, "body.prompt"),
        ({"prompt": "p\u0000", "response": "r", "score": 0.5}, "body.prompt"),
        ({"prompt": "p", "response": "r", "score": 0.5, "rating": 3}, "body.rating"),
        ({"prompt": "p", "response": "r", "score": "high"}, "body.score"),
    ],
)
def test_invalid_feedback_gets_422_naming_the_field(client, body, field):
    response = client.post(FEEDBACK.format("agent-8"), json=body, headers=auth())
    assert response.status_code == 422
    payload = response.json()
    assert field in [e["field"] for e in payload["errors"]]
    assert field in payload["detail"]


def test_malformed_json_and_oversized_bodies_are_rejected(make_client):
    client = make_client(max_body_bytes=4096)
    broken = client.post(
        FEEDBACK.format("agent-9"),
        content=b'{"prompt": ',
        headers={**auth(), "Content-Type": "application/json"},
    )
    assert broken.status_code == 422
    huge = {"prompt": "p", "response": "x" * 5000, "score": 0.5}
    too_big = client.post(FEEDBACK.format("agent-9"), json=huge, headers=auth())
    assert too_big.status_code == 413

    def chunks():
        yield b'{"prompt": "p", "response": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'", "score": 0.5}'

    streamed = client.post(
        FEEDBACK.format("agent-9"), content=chunks(), headers={**auth(), "Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    assert client.app.state.store.count_feedback() == 0


def test_internal_errors_reach_clients_without_a_stack_trace(client, monkeypatch, caplog):
    def explode(*_args, **_kwargs):
        raise RuntimeError("secret connection string postgres://u:p@db")

    monkeypatch.setattr(client.app.state.store, "feedback_stats", explode)
    response = client.post(TRAIN.format("agent-10"), json={"dryRun": True}, headers=auth())
    assert response.status_code == 500
    assert "secret" not in response.text and "Traceback" not in response.text
    assert response.json()["detail"].startswith("internal server error")
    assert any("secret connection string" in str(r.exc_info) for r in caplog.records if r.exc_info)


def test_openapi_schema_describes_the_endpoints(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    assert set(paths) >= {
        "/api/policies/feedback/{agent_id}",
        "/api/policies/train_policy/{agent_id}",
        "/api/policies/jobs/{job_id}",
        "/api/policies/{agent_id}",
    }
    feedback = paths["/api/policies/feedback/{agent_id}"]["post"]
    agent_param = next(p for p in feedback["parameters"] if p["name"] == "agent_id")
    assert agent_param["schema"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
    components = schema["components"]["schemas"]
    assert set(components["ScoredFeedbackIn"]["properties"]) == {
        "prompt",
        "response",
        "score",
        "runId",
        "notes",
    }
    assert set(components["PairwiseFeedbackIn"]["properties"]) >= {"prompt", "chosen", "rejected"}
    assert set(components["DryRunOut"]["properties"]) >= {
        "feedbackCount",
        "estimatedSteps",
        "estimatedTimeMinutes",
        "scoreMean",
        "scoreStd",
        "modelConfig",
    }
    assert set(components["JobOut"]["properties"]) >= {
        "policyId",
        "version",
        "modelPath",
        "rewardModelPath",
        "feedbackCount",
        "trainingSteps",
        "rewardMean",
        "rewardStd",
    }
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    train = paths["/api/policies/train_policy/{agent_id}"]["post"]
    assert {"200", "202", "400"} <= set(train["responses"])


def test_migrations_bring_an_empty_database_to_head(make_settings):
    from alignflow.service.migrate import current_revision, head_revision, upgrade_database
    from alignflow.service.storage import make_engine

    engine = make_engine(make_settings().database_url)
    upgrade_database(engine)
    upgrade_database(engine)  # idempotent
    assert current_revision(engine) == head_revision() == "0002"
    with engine.connect() as conn:
        assert {"feedback", "jobs", "api_tokens", "generations", "traffic_splits", "alembic_version"} <= set(
            sa.inspect(conn).get_table_names()
        )
        if engine.dialect.name == "sqlite":
            assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
    engine.dispose()


def test_tokens_are_stored_hashed(client):
    from .conftest import ADMIN

    with client.app.state.engine.connect() as conn:
        stored = [r[0] for r in conn.execute(sa.text("SELECT token_hash FROM api_tokens"))]
    assert len(stored) == 2
    assert ADMIN not in stored and SCOPED not in stored
    assert all(len(h) == 64 for h in stored)
