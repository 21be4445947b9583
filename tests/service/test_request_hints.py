"""Errors a first-time user meets say what to do: a body sent without a JSON content type
(``curl -d`` sends form-encoded), and a ``--token`` that is too short."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.service.settings import ServiceSettings, TokenSpec
from tests.service.conftest import auth

BODY = json.dumps({"prompt": "What is 2 plus 3?", "response": "5", "score": 0.9})
HINT = "send the header Content-Type: application/json"


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
@pytest.mark.parametrize(
    "path", ["/api/policies/feedback/my_agent", "/api/policies/train_policy/my_agent?wait=true"]
)
def test_a_body_not_sent_as_json_gets_a_422_naming_the_header(client, path, content_type):
    headers = auth() | ({"Content-Type": content_type} if content_type else {})
    response = client.post(path, content=BODY, headers=headers)
    assert response.status_code == 422, response.text
    payload = response.json()
    assert HINT in payload["detail"]
    assert f"(Content-Type: {content_type or 'none'})" in payload["detail"]
    assert [e["field"] for e in payload["errors"]] == ["body"]


def test_a_json_body_with_a_bad_field_gets_no_content_type_hint(client):
    bad = {"prompt": "p", "response": "r", "score": 7}
    response = client.post("/api/policies/feedback/my_agent", json=bad, headers=auth())
    assert response.status_code == 422
    assert "Content-Type" not in response.json()["detail"]


def test_the_same_body_as_json_is_accepted(client):
    headers = auth() | {"Content-Type": "application/json"}
    response = client.post("/api/policies/feedback/my_agent", content=BODY, headers=headers)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("spelling", ["short", "short:agent_a", ":agent_a"])
def test_a_short_token_is_one_clear_line(spelling):
    with pytest.raises(ValueError) as caught:
        TokenSpec.parse(spelling)
    message = str(caught.value)
    assert "\n" not in message and "validation error" not in message and "pydantic" not in message
    assert message.startswith("a bearer token needs at least 16 characters")
    assert "short" not in message, "the token itself is not echoed"
    assert "secrets.token_urlsafe" in message


def test_a_short_token_in_the_environment_is_the_same_message_naming_the_variable():
    with pytest.raises(
        ValueError, match="^ALIGNFLOW_API_TOKENS: a bearer token needs at least 16 characters, this one has 3"
    ):
        ServiceSettings.from_env({"ALIGNFLOW_API_TOKENS": "abc"})


def test_alignflow_api_refuses_a_short_token_with_that_message():
    result = CliRunner().invoke(app, ["api", "--token", "short"])
    assert result.exit_code == 2
    flat = " ".join(result.output.replace("│", " ").split())
    assert flat.startswith("error: --token: a bearer token needs at least 16 characters, this one has 5")
    assert "validation error" not in flat and "input_value" not in flat
