import json

import mlflow
import pytest
from mlflow import MlflowClient

from alignflow.registry import models, promotion
from alignflow.registry.promotion import PromotionConfig


def test_a_missing_metric_fails_its_gate_and_none_switches_a_gate_off():
    config = PromotionConfig(max_kl=0.5, max_length_growth=None)
    gates = promotion.gates_for(config, "policy", has_champion=True)
    assert [g.name for g in gates] == ["win_rate_vs_champion", "kl"]
    results = promotion.check_gates({promotion.WIN_RATE_VS_CHAMPION: 0.6}, gates)
    assert [(r.name, r.passed) for r in results] == [("win_rate_vs_champion", True), ("kl", False)]
    assert results[1].value is None and "missing" in results[1].describe()


def test_first_policy_must_strictly_beat_the_reference():
    gates = promotion.gates_for(PromotionConfig(), "policy", has_champion=False)
    beats = next(g for g in gates if g.name == "beats_reference")
    assert not promotion.check_gates({promotion.WIN_RATE_VS_REFERENCE: 0.5}, [beats])[0].passed
    assert promotion.check_gates({promotion.WIN_RATE_VS_REFERENCE: 0.51}, [beats])[0].passed


def test_reward_gates_read_accuracy_and_calibration():
    gates = promotion.gates_for(PromotionConfig(max_reward_ece=0.1), "reward", has_champion=True)
    ok = promotion.check_gates({promotion.REWARD_ACCURACY: 0.8, promotion.CALIBRATION_ERROR: 0.05}, gates)
    bad = promotion.check_gates({promotion.REWARD_ACCURACY: 0.8, promotion.CALIBRATION_ERROR: 0.3}, gates)
    assert all(r.passed for r in ok)
    assert [r.name for r in bad if not r.passed] == ["reward_ece"]


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


GOOD = {
    promotion.WIN_RATE_VS_REFERENCE: 0.8,
    promotion.WIN_RATE_VS_CHAMPION: 0.7,
    promotion.LENGTH_GROWTH_RATIO: 1.1,
    promotion.KL_TO_REFERENCE: 0.2,
}


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
def test_first_model_becomes_champion_only_when_it_beats_the_reference(registry):
    uri, logged = registry
    config = PromotionConfig()
    losing = promotion.promote(
        uri, logged.name, logged.version, {**GOOD, promotion.WIN_RATE_VS_REFERENCE: 0.4}, config, "policy"
    )
    assert not losing.promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) is None
    assert "beats_reference" in json.loads(
        MlflowClient(uri).get_model_version(logged.name, logged.version).tags[promotion.FAILED_GATES_TAG]
    )
    second = _new_version(uri, logged)
    assert promotion.promote(uri, logged.name, second, GOOD, config, "policy").promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) == second


@pytest.mark.slow
def test_worse_challenger_leaves_champion_and_carries_failed_gates_then_rollback(registry):
    uri, logged = registry
    client = MlflowClient(uri)
    config = PromotionConfig(max_kl=1.0)
    assert promotion.promote(uri, logged.name, logged.version, GOOD, config, "policy").promoted

    worse = _new_version(uri, logged)
    worse_metrics = {**GOOD, promotion.WIN_RATE_VS_CHAMPION: 0.3, promotion.LENGTH_GROWTH_RATIO: 3.5}
    decision = promotion.promote(uri, logged.name, worse, worse_metrics, config, "policy")
    assert not decision.promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) == logged.version
    assert models.alias_version(uri, logged.name, models.CHALLENGER) == worse
    tags = client.get_model_version(logged.name, worse).tags
    assert tags[promotion.DECISION_TAG] == "rejected"
    failed = json.loads(tags[promotion.FAILED_GATES_TAG])
    assert failed == {
        "win_rate_vs_champion": {"value": 0.3, "op": ">=", "threshold": 0.55},
        "length_growth": {"value": 3.5, "op": "<=", "threshold": 2.0},
    }
    assert promotion.recorded_metrics(uri, logged.name, worse) == worse_metrics

    better = _new_version(uri, logged)
    assert promotion.promote(uri, logged.name, better, GOOD, config, "policy").promoted
    assert (
        client.get_model_version(logged.name, better).tags[promotion.PREVIOUS_CHAMPION_TAG] == logged.version
    )

    assert promotion.rollback(uri, logged.name) == (better, logged.version)
    assert models.alias_version(uri, logged.name, models.CHAMPION) == logged.version
    assert client.get_model_version(logged.name, better).tags[promotion.DECISION_TAG] == "rolled_back"
    with pytest.raises(LookupError, match="no previous champion"):
        promotion.rollback(uri, logged.name)
