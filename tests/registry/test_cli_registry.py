import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.registry import models, promotion
from tests.registry.conftest import FIRST_POLICY, MATCHES_CHAMPION, pinned_metrics


@pytest.mark.slow
def test_promote_dry_run_then_rejects_then_force_then_rollback(tmp_path, tiny_model_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        first = models.log_model(tiny_model_dir, uri, "cli-policy")
    second = models.register(uri, first.model_uri, "cli-policy", first.run_id)
    common = ["--tracking-uri", uri, "--set", "project=cli"]
    runner = CliRunner()

    promotion.record_metrics(uri, "cli-policy", first.version, FIRST_POLICY)
    dry = runner.invoke(app, ["promote", "--version", first.version, "--dry-run", *common])
    assert dry.exit_code == 0, dry.output
    assert "would be promoted" in dry.output and "[0.85, 0.95]" in dry.output and "lower bound" in dry.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) is None, "a dry run changes nothing"
    result = runner.invoke(app, ["promote", "--version", first.version, *common])
    assert result.exit_code == 0, result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == first.version

    regression = MATCHES_CHAMPION | pinned_metrics(task_accuracy_vs_champion=(-0.5, -0.6, -0.4, 120))
    promotion.record_metrics(uri, "cli-policy", second.version, regression)
    dry = runner.invoke(app, ["promote", "--dry-run", *common])
    assert (
        dry.exit_code == 1 and "would be rejected" in dry.output and "task_accuracy_vs_champion" in dry.output
    )
    result = runner.invoke(app, ["promote", *common])  # the challenger: version 2
    assert result.exit_code == 1
    assert "task_accuracy_vs_champion" in result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == first.version

    result = runner.invoke(app, ["promote", "--version", second.version, "--force", *common])
    assert result.exit_code == 0, result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == second.version
    page = MlflowClient(uri).get_model_version("cli-policy", second.version).description
    said, earlier = page.split("\n\n---\n\n")  # newest first, the gated decision kept below
    assert said.startswith("**Promoted to champion by hand, gates not checked, replacing version 1.** (")
    assert earlier.startswith("**Not promoted (failed: ") and "task_accuracy_vs_champion" in earlier

    result = runner.invoke(app, ["rollback", *common])
    assert result.exit_code == 0, result.output
    assert models.alias_version(uri, "cli-policy", models.CHAMPION) == first.version
    rolled_back = MlflowClient(uri).get_model_version("cli-policy", second.version)
    assert rolled_back.description.startswith("**Rolled back: champion returned to version 1.** (")
    assert rolled_back.tags[promotion.OUTCOME_TAG] == "rolled_back"
    assert runner.invoke(app, ["rollback", *common]).exit_code == 1
