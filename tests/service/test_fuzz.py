"""Property-based fuzzing of the whole API from its OpenAPI schema: no input yields a 5xx.

Schemathesis generates valid and invalid requests (bodies, path ids, headers) for every
operation; each must be answered with a documented, non-5xx response.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance

from alignflow.service.jobs import TrainingOutcome, TrainingRequest

from .conftest import auth


class InstantLauncher:
    """Finishes every job at once: fuzzing exercises the API, not training."""

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        return TrainingOutcome(
            policy_id="p",
            version="v1",
            model_path=str(request.output_dir),
            feedback_count=request.feedback_count,
            training_steps=request.max_steps,
        )


@pytest.fixture
def api_schema(make_client):
    client = make_client(InstantLauncher(), min_feedback=1)
    # the first registry read creates MLflow's tables (seconds on a busy machine): not a fuzzing matter
    assert client.get("/api/policies/warm-up", headers=auth()).status_code == 200
    return schemathesis.openapi.from_asgi("/openapi.json", client.app)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    case.call_and_validate(
        headers=auth(),
        checks=[not_a_server_error, status_code_conformance, response_schema_conformance],
    )
