"""What ``alignflow promote`` prints: a dry run on the champion itself says nothing would change,
the gate table keeps every gate's name whole, and every judge that counted is named."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.promotion import gates
from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.registry import models, promotion
from tests.registry.conftest import FIRST_POLICY

NAME = "cli-policy"


@pytest.fixture
def champion_version(tmp_path) -> tuple[str, str]:
    """Version 1 of ``cli-policy``, already champion, with passing pinned-set metrics; no model
    files are needed: promote reads the metrics of the run that logged the version."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    client.create_registered_model(NAME)
    run_id = client.create_run("0").info.run_id
    version = client.create_model_version(NAME, (tmp_path / "model").as_uri(), run_id=run_id).version
    promotion.record_metrics(uri, NAME, str(version), FIRST_POLICY)
    # the pipeline trusted the champion reward model: its gates have the longest names
    client.set_model_version_tag(NAME, str(version), promotion.JUDGES_TAG, "champion_reward")
    client.set_registered_model_alias(NAME, models.CHAMPION, str(version))
    return uri, str(version)


def _promote(uri: str, *args: str):
    return CliRunner().invoke(app, ["promote", "--tracking-uri", uri, "--set", "project=cli", *args])


def test_a_dry_run_on_the_champion_says_nothing_would_change(champion_version):
    uri, version = champion_version
    result = _promote(uri, "--version", version, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would be promoted" not in result.output
    assert f"(was {version})" not in result.output
    said = f"version {version} passes every gate and is already champion; nothing would change"
    assert said in result.output


def test_gate_names_are_never_cut_in_the_table(champion_version):
    uri, version = champion_version
    result = _promote(uri, "--version", version, "--dry-run")
    assert "…" not in result.output
    decision = gates.decide(
        NAME, version, FIRST_POLICY, PromotionConfig(), "policy", None, ["champion_reward"]
    )
    assert decision.results
    for gate in decision.results:
        assert gate.name in result.output, f"{gate.name} cut in:\n{result.output}"


def test_every_judge_that_counted_is_named_the_verifiable_answers_first(champion_version):
    uri, version = champion_version
    result = _promote(uri, "--version", version, "--dry-run")
    judges_line = next(line for line in result.output.splitlines() if line.startswith("judges that count"))
    assert judges_line == "judges that count: verifiable answers (100 pinned prompts), champion_reward"


def test_force_on_the_champion_says_nothing_changed(champion_version):
    uri, version = champion_version
    result = _promote(uri, "--version", version, "--force")
    assert result.exit_code == 0, result.output
    assert "nothing changed" in result.output and "(was" not in result.output


def test_the_run_summary_names_every_judge_that_counted_as_the_version_page_does(capsys):
    from alignflow.cli.pipeline import render_summary
    from alignflow.registry.decision_card import decision_entry, judges_line

    decision = gates.decide(NAME, "2", FIRST_POLICY, PromotionConfig(), "policy", None, ["champion_reward"])
    entry = decision_entry(decision)
    assert entry["judges"] == ["verifiable answers (100 pinned prompts)", "champion_reward"]
    summary = {
        "project": "cli",
        "stages": [],
        "data_version": "abc",
        "promotions": {"policy": entry},
        "wall_seconds": 1.0,
        "compute_seconds": 1.0,
        "orchestration_overhead": 0.0,
    }
    render_summary(summary)
    printed = capsys.readouterr().out
    assert f"judges that counted: {judges_line(decision, 100)}" in printed
    assert "independent_judge: 2" in printed  # both judges the gate counted are named


def test_a_rollback_with_nothing_to_go_back_to_is_one_error_line(champion_version):
    uri, version = champion_version
    result = CliRunner().invoke(app, ["rollback", "--tracking-uri", uri, "--set", "project=cli"])
    assert result.exit_code == 1
    assert result.output == f"error: {NAME}: champion version {version} has no previous champion\n"
