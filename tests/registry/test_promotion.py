import json

import mlflow
import pytest
from mlflow import MlflowClient

from alignflow.registry import models, promotion
from alignflow.registry.promotion import PromotionConfig
from tests.registry.conftest import FIRST_POLICY, MATCHES_CHAMPION, pinned_metrics


@pytest.fixture
def registry(tmp_path, tiny_model_dir):
    """One real transformers-flavour model logged to a tmp sqlite store; returns (uri, name, model_uri)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = models.log_model(tiny_model_dir, uri, "demo-policy", tags={"data.version": "d1"})
    return uri, logged


def _new_version(uri: str, logged: models.LoggedVersion) -> str:
    return models.register(uri, logged.model_uri, logged.name, logged.run_id).version


JUDGES = ["champion_reward"]
GOOD = {**MATCHES_CHAMPION, promotion.KL_TO_REFERENCE: 0.2}


@pytest.mark.slow
def test_logged_model_is_registered_as_challenger_with_its_tags(registry):
    uri, logged = registry
    version = MlflowClient(uri).get_model_version(logged.name, logged.version)
    assert version.aliases == [models.CHALLENGER]
    assert version.tags["data.version"] == "d1"
    assert version.tags[models.MODEL_KIND_TAG] == "text-generation"
    components = models.load_components(uri, logged.name, models.CHALLENGER)
    assert components["model"].config.num_hidden_layers == 2
    assert models.load_components(uri, logged.name, models.CHAMPION) is None


@pytest.mark.slow
def test_first_model_becomes_champion_only_when_its_bound_beats_the_reference(registry):
    uri, logged = registry
    config = PromotionConfig()
    # a lucky point estimate: 0.57 looks like a win, but its interval reaches down to 0.33
    lucky = FIRST_POLICY | pinned_metrics(champion_reward__win_rate_vs_reference=(0.57, 0.33, 0.79, 120))
    losing = promotion.promote(uri, logged.name, logged.version, lucky, config, "policy", JUDGES)
    assert not losing.promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) is None
    tags = MlflowClient(uri).get_model_version(logged.name, logged.version).tags
    failed = json.loads(tags[promotion.FAILED_GATES_TAG])
    assert list(failed) == ["champion_reward_beats_reference"]
    assert failed["champion_reward_beats_reference"]["low"] == 0.33
    assert failed["champion_reward_beats_reference"]["n"] == 120
    assert tags[promotion.GATE_TAG_PREFIX + "champion_reward_beats_reference"].startswith("failed:")
    assert tags[promotion.JUDGES_TAG] == "champion_reward"
    second = _new_version(uri, logged)
    assert promotion.promote(uri, logged.name, second, FIRST_POLICY, config, "policy", JUDGES).promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) == second


@pytest.mark.slow
def test_too_few_judged_rows_never_promote(registry):
    uri, logged = registry
    few = pinned_metrics(
        answers=14,
        task_accuracy_gain=(0.57, 0.31, 0.79, 14),
        length_growth_ratio=(1.4, 1.35, 1.45, 14),
    )
    decision = promotion.promote(uri, logged.name, logged.version, few, PromotionConfig(), "policy")
    assert not decision.promoted
    assert {r.name: r.outcome for r in decision.failed} == {
        "task_accuracy_gain": promotion.INSUFFICIENT_EVIDENCE,
        "length_growth": promotion.INSUFFICIENT_EVIDENCE,
    }
    assert models.alias_version(uri, logged.name, models.CHAMPION) is None


@pytest.mark.slow
def test_worse_challenger_leaves_champion_and_carries_failed_gates_then_rollback(registry):
    uri, logged = registry
    client = MlflowClient(uri)
    config = PromotionConfig(max_kl=1.0)
    assert promotion.promote(uri, logged.name, logged.version, GOOD, config, "policy", JUDGES).promoted

    worse = _new_version(uri, logged)
    worse_metrics = GOOD | pinned_metrics(
        champion_reward__win_rate_vs_champion=(0.3, 0.22, 0.38, 120),
        length_growth_ratio=(3.5, 3.3, 3.7, 120),
    )
    decision = promotion.promote(uri, logged.name, worse, worse_metrics, config, "policy", JUDGES)
    assert not decision.promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) == logged.version
    assert models.alias_version(uri, logged.name, models.CHALLENGER) == worse
    tags = client.get_model_version(logged.name, worse).tags
    assert tags[promotion.DECISION_TAG] == "rejected"
    failed = json.loads(tags[promotion.FAILED_GATES_TAG])
    assert set(failed) == {"champion_reward_win_rate_vs_champion", "length_growth"}
    assert failed["champion_reward_win_rate_vs_champion"] | {} == {
        "outcome": "failed", "value": 0.3, "low": 0.22, "high": 0.38, "n": 120,
        "bound": "low", "op": ">=", "threshold": 0.4,
    }  # fmt: skip
    assert failed["length_growth"]["bound"] == "high" and failed["length_growth"]["high"] == 3.7
    assert promotion.recorded_metrics(uri, logged.name, worse) == worse_metrics

    better = _new_version(uri, logged)
    assert promotion.promote(uri, logged.name, better, GOOD, config, "policy", JUDGES).promoted
    assert (
        client.get_model_version(logged.name, better).tags[promotion.PREVIOUS_CHAMPION_TAG] == logged.version
    )

    assert promotion.rollback(uri, logged.name) == (better, logged.version)
    assert models.alias_version(uri, logged.name, models.CHAMPION) == logged.version
    assert client.get_model_version(logged.name, better).tags[promotion.DECISION_TAG] == "rolled_back"
    with pytest.raises(LookupError, match="no previous champion"):
        promotion.rollback(uri, logged.name)
