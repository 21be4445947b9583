"""A training request's bad setting is named as the client sent it (the JSON field), not as the
command line's ``--set key=value``, and an unknown field gets the closest one the request has."""

from __future__ import annotations

from .conftest import auth
from .test_api import FEEDBACK, TRAIN, pair_bodies


def _with_feedback(client, agent: str = "agent-s"):
    for body in pair_bodies(12):
        assert client.post(FEEDBACK.format(agent), json=body, headers=auth()).status_code == 201
    return agent


def test_a_setting_the_config_refuses_is_named_by_its_request_field(client):
    agent = _with_feedback(client)
    body = {"dryRun": True, "algorithm": "grpo", "batchSize": 3}
    response = client.post(TRAIN.format(agent), json=body, headers=auth())
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "request field batchSize=3: " in detail, detail
    assert "must be a multiple of grpo.num_generations" in detail
    assert "--set" not in detail


def test_an_unknown_field_gets_the_closest_field(client):
    agent = _with_feedback(client)
    response = client.post(TRAIN.format(agent), json={"dryRun": True, "batchSise": 4}, headers=auth())
    assert response.status_code == 422, response.text
    payload = response.json()
    assert {"field": "body.batchSise", "message": "not a field of this request; did you mean batchSize?"} in (
        payload["errors"]
    )
    assert "did you mean batchSize?" in payload["detail"]
