import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.registry import models, promotion


@pytest.mark.slow
def test_promote_rejects_then_force_then_rollback(tmp_path, tiny_model_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        first = models.log_model(tiny_model_dir, uri, "cli-policy")
    second = models.register(uri, first.model_uri, "cli-policy", first.run_id)
    common = ["--tracking-uri", uri, "--set", "project=cli"]
    runner = CliRunner()

    promotion.record_metrics(
        uri,
        "cli-policy",
        first.version,
        {promotion.WIN_RATE_VS_REFERENCE: 0.9, promotion.LENGTH_GROWTH_RATIO: 1.0},
    )
    result = runner.invoke(app, ["promote", "--version", first.version, *common])
    assert result.exit_code == 0, result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == first.version

    promotion.record_metrics(uri, "cli-policy", second.version, {promotion.WIN_RATE_VS_CHAMPION: 0.2})
    result = runner.invoke(app, ["promote", *common])  # the challenger: version 2
    assert result.exit_code == 1
    assert "win_rate_vs_champion" in result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == first.version

    result = runner.invoke(app, ["promote", "--version", second.version, "--force", *common])
    assert result.exit_code == 0, result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == second.version

    result = runner.invoke(app, ["rollback", *common])
    assert result.exit_code == 0, result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == first.version
    assert runner.invoke(app, ["rollback", *common]).exit_code == 1
