"""``alignflow api``: the pipeline config of training jobs comes from --config and --set."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app

TOKEN = "cli-token-0123456789abcdef"


def test_config_and_overrides_reach_the_training_jobs(served, tmp_path: Path):
    config = tmp_path / "jobs.yaml"
    config.write_text("model:\n  name: tiny\n  hidden_size: 32\nppo:\n  max_new_tokens: 7\n")
    result = CliRunner().invoke(
        app,
        [
            "api",
            "--token",
            TOKEN,
            "--launcher",
            "library",
            "--config",
            str(config),
            "--set",
            "ppo.max_steps=9",
        ],
    )
    assert result.exit_code == 0, result.output
    settings = served["app"].state.settings
    assert settings.pipeline_config == config and settings.pipeline_overrides == ["ppo.max_steps=9"]
    from fastapi.testclient import TestClient

    with TestClient(served["app"]) as client:
        for i in range(10):
            body = {"prompt": f"q{i}?", "response": "a", "score": i / 10}
            client.post("/api/policies/feedback/a1", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        dry = client.post(
            "/api/policies/train_policy/a1",
            json={"dryRun": True},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()
    assert dry["modelConfig"]["max_steps"] == 9 and dry["modelConfig"]["algorithm"] == "ppo"
    assert "tiny-v512-h32" in dry["estimateBasis"]  # the estimate is for the configured model size


@pytest.mark.parametrize(
    "args",
    [["--set", "ppo.no_such_knob=1"], ["--config", "missing.yaml"], ["--set", "ppo.max_steps=-3"]],
)
def test_a_config_that_cannot_train_stops_the_command_before_serving(served, args):
    result = CliRunner().invoke(app, ["api", "--token", TOKEN, "--launcher", "library", *args])
    assert result.exit_code == 2, result.output
    assert "app" not in served


def test_a_token_on_the_command_line_is_served_with_a_warning_the_environment_is_not(served, monkeypatch):
    """``--token`` still works, but it is in every user's ``ps -ef``: the command says so and
    names the two ways that keep it out of the process list."""
    on_the_line = CliRunner().invoke(app, ["api", "--token", TOKEN, "--launcher", "library"])
    assert on_the_line.exit_code == 0, on_the_line.output
    assert "warning: --token shows the token to every user" in on_the_line.output
    assert "ALIGNFLOW_API_TOKEN or a --token-file" in on_the_line.output
    monkeypatch.setenv("ALIGNFLOW_API_TOKEN", TOKEN)
    from_the_environment = CliRunner().invoke(app, ["api", "--launcher", "library"])
    assert from_the_environment.exit_code == 0, from_the_environment.output
    assert "warning" not in from_the_environment.output
