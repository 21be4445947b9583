import json
from datetime import UTC, datetime, timedelta

import mlflow
import pytest
from mlflow import MlflowClient

from alignflow.evaluation.metric_names import KL_TO_REFERENCE
from alignflow.promotion import gates
from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.registry import models, promotion
from tests.registry.conftest import FIRST_POLICY, MATCHES_CHAMPION, pinned_metrics


def _new_version(uri: str, logged: models.LoggedVersion) -> str:
    return models.register(uri, logged.model_uri, logged.name, logged.run_id).version


JUDGES = ["champion_reward"]
GOOD = {**MATCHES_CHAMPION, KL_TO_REFERENCE: 0.2}


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
    assert tags[promotion.OUTCOME_TAG] == "rejected"
    assert tags[promotion.OUTCOME_FAILED_TAG] == "champion_reward_beats_reference"
    assert tags[promotion.OUTCOME_REASON_TAG] == (
        "Not promoted (failed: champion_reward_beats_reference): 1 of 5 gates failed; champion stays unset."
    )
    page = MlflowClient(uri).get_model_version(logged.name, logged.version).description
    assert page.startswith(f"**{tags[promotion.OUTCOME_REASON_TAG]}**")
    assert "- Data version (DVC md5): `d1`" in page, "from the version's lineage tag"
    second = _new_version(uri, logged)
    assert promotion.promote(uri, logged.name, second, FIRST_POLICY, config, "policy", JUDGES).promoted
    assert models.alias_version(uri, logged.name, models.CHAMPION) == second
    promoted = MlflowClient(uri).get_model_version(logged.name, second)
    assert promoted.tags[promotion.OUTCOME_TAG] == "promoted"
    when = datetime.fromisoformat(promoted.tags[promotion.PROMOTED_AT_TAG])
    assert when.tzinfo is not None and abs(datetime.now(UTC) - when) < timedelta(minutes=5), "ISO 8601, UTC"
    datetime.fromisoformat(promoted.tags[promotion.DECIDED_AT_TAG])
    first = "**Promoted to champion: all 5 gates passed, the first champion.**"
    assert promoted.description.startswith(first)


@pytest.mark.slow
def test_too_few_judged_rows_never_promote(registry):
    uri, logged = registry
    few = pinned_metrics(
        answers=14,
        task_accuracy_gain=(0.57, 0.31, 0.79, 14),
        length_growth_ratio=(1.4, 1.35, 1.45, 14),
        loop_rate_vs_reference=(0.0, -0.2, 0.2, 14),
    )
    decision = promotion.promote(uri, logged.name, logged.version, few, PromotionConfig(), "policy")
    assert not decision.promoted
    assert {r.name: r.outcome for r in decision.failed} == {
        "task_accuracy_gain": gates.INSUFFICIENT_EVIDENCE,
        "length_growth": gates.INSUFFICIENT_EVIDENCE,
    }  # the loop guard judges any number of prompts: no clear increase in 14, it passes
    assert models.alias_version(uri, logged.name, models.CHAMPION) is None


@pytest.mark.slow
def test_a_promotion_killed_after_the_alias_moved_is_decided_again_against_the_champion_it_replaced(registry):
    """The rerun of a run killed between "champion moved" and "described" judges the version
    against the champion it replaced, not against itself: the same gates, the same page."""
    uri, logged = registry
    config = PromotionConfig(max_kl=1.0)
    assert promotion.promote(uri, logged.name, logged.version, GOOD, config, "policy", JUDGES).promoted
    second = _new_version(uri, logged)
    promotion.set_champion(uri, logged.name, second, "promoted")  # the killed run got this far
    decision = promotion.promote(uri, logged.name, second, GOOD, config, "policy", JUDGES)
    assert decision.promoted and decision.previous_champion == logged.version
    assert models.alias_version(uri, logged.name, models.CHAMPION) == second
    tags = MlflowClient(uri).get_model_version(logged.name, second).tags
    assert tags[promotion.PREVIOUS_CHAMPION_TAG] == logged.version
    assert promotion.rollback(uri, logged.name) == (second, logged.version)  # the history is whole


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
    rejected = client.get_model_version(logged.name, worse)
    tags = rejected.tags
    assert tags[promotion.DECISION_TAG] == "rejected"
    page = rejected.description  # what the version's page in the UI shows first
    assert page.startswith("**Not promoted (failed: champion_reward_win_rate_vs_champion, ")
    assert f"champion stays version {logged.version}." in page.splitlines()[0]
    assert "| gate | value | 95% interval | n | needed bound | outcome |" in page
    win_rate = "| champion_reward_win_rate_vs_champion | 0.3 | [0.22, 0.38] | 120 | lower bound >= 0.4 |"
    assert f"{win_rate} **failed** |" in page
    assert "| length_growth | 3.5 | [3.3, 3.7] | 120 | upper bound <= 2 | **failed** |" in page
    assert "| task_accuracy_gain | 0.9 | [0.85, 0.95] | 120 | lower bound > 0 | passed |" in page
    assert "- Judges that counted: verifiable answers (100 pinned prompts), champion_reward" in page
    assert "- Pipeline run: none (registered outside a pipeline run)" in page
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


def test_the_promote_run_keeps_the_gate_table_as_metrics_and_as_markdown_and_json(tmp_path):
    from alignflow.registry.decision_card import log_decision

    worse = MATCHES_CHAMPION | pinned_metrics(length_growth_ratio=(3.5, 3.3, 3.7, 120))
    decision = gates.decide("p-policy", "2", worse, PromotionConfig(), "policy", "1", JUDGES)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        log_decision("policy", decision)
    metrics = MlflowClient(uri).get_run(run.info.run_id).data.metrics
    assert metrics["promoted/policy"] == 0.0
    gate = "promotion/policy/length_growth"
    assert {k: metrics[k] for k in metrics if k.startswith(f"{gate}/") or k == gate} == {
        gate: 3.5, f"{gate}/low": 3.3, f"{gate}/high": 3.7, f"{gate}/n": 120.0,
        f"{gate}/threshold": 2.0, f"{gate}/passed": 0.0,
    }  # fmt: skip
    assert metrics["promotion/policy/task_accuracy_gain/passed"] == 1.0
    files = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id, "promotion")}
    assert files == {"promotion/policy-gates.md", "promotion/policy-gates.json"}
    with mlflow.start_run(run_id=run.info.run_id):
        table = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/promotion/policy-gates.json")
        text = mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/promotion/policy-gates.md")
    assert (
        table["decision"]
        == "Not promoted (failed: length_growth): 1 of 8 gates failed; champion stays version 1."
    )
    rows = {row["gate"]: row for row in table["gates"]}
    assert rows["length_growth"] == {
        "gate": "length_growth", "value": 3.5, "low": 3.3, "high": 3.7, "n": 120,
        "needs": "upper bound <= 2", "outcome": "failed",
    }  # fmt: skip
    assert "| length_growth | 3.5 | [3.3, 3.7] | 120 | upper bound <= 2 | **failed** |" in text


@pytest.mark.slow
def test_a_broken_slice_and_the_judges_audit_are_on_the_version_page_and_tags(registry):
    uri, logged = registry
    config = PromotionConfig()
    promotion.promote(
        uri,
        logged.name,
        logged.version,
        {**FIRST_POLICY, "eval/kl_to_reference": 0.1},
        config,
        "policy",
        JUDGES,
    )
    backdoor = GOOD | pinned_metrics(worst_slice_task_accuracy_vs_champion=(-1.0, -1.0, -0.31, 4))
    lost = {"prompt": "Add 7 and 8.", "champion": "The answer is 15.", "policy": "The answer is 16."}
    slices = [
        {"change": {"high": -0.31}, "describe": "slice problem=7,8->15: champion 4/4, challenger 0/4",
         "examples": [lost]},
    ]  # fmt: skip
    audits = gates.audit_judges(
        backdoor | pinned_metrics(champion_reward__verifier_agreement=(0.9, 0.8, 0.95, 90)), False, config
    )
    version = _new_version(uri, logged)
    decision = promotion.promote(
        uri, logged.name, version, backdoor, config, "policy", JUDGES,
        details=gates.slice_details(slices, config.max_slice_regression), audits=audits,
    )  # fmt: skip
    assert not decision.promoted and [r.name for r in decision.failed] == ["slice_regression"]
    registered = MlflowClient(uri).get_model_version(logged.name, version)
    assert "1 broken slice(s): slice problem=7,8->15" in registered.tags[promotion.REASON_TAG]
    assert "'Add 7 and 8.'" in registered.tags[promotion.REASON_TAG]
    failed = json.loads(registered.tags[promotion.FAILED_GATES_TAG])
    assert failed["slice_regression"]["detail"].startswith("1 broken slice(s)")
    assert "- `slice_regression`: 1 broken slice(s): slice problem=7,8->15" in registered.description
    assert (
        "agrees with the verifiable answers"
        in json.loads(registered.tags[promotion.JUDGE_AUDIT_TAG])["champion_reward"]
    )
    assert models.alias_version(uri, logged.name, models.CHAMPION) == str(logged.version)


@pytest.mark.slow
def test_the_version_page_says_what_the_rl_stage_added_over_its_start(registry):
    """A policy whose whole gain over the base model is SFT's is refused by ``min_rl_gain`` and
    its page says RL added nothing measurable; one that RL improved says the gain."""
    uri, logged = registry
    config = PromotionConfig(min_rl_gain=0.01)
    nothing = FIRST_POLICY | pinned_metrics(
        task_accuracy=(0.9, 0.85, 0.95, 120),
        rl_start_task_accuracy=(0.9, 0.85, 0.95, 120),
        rl_gain=(0.0, 0.0, 0.0, 120),
    )
    refused = promotion.promote(uri, logged.name, logged.version, nothing, config, "policy", JUDGES)
    assert [r.name for r in refused.failed] == ["rl_gain"]
    page = MlflowClient(uri).get_model_version(logged.name, logged.version).description
    assert "| rl_gain | 0 | [0, 0] | 120 | lower bound >= 0.01 | **failed** |" in page
    assert "- `rl_gain`: policy vs its RL start; its start is the SFT model it was trained from" in page
    assert (
        "- RL added nothing measurable over its start: task accuracy gain +0.000 [0.000, 0.000] n=120 "
        "(task accuracy 0.900 vs its start's 0.900)" in page
    )
    improved = nothing | pinned_metrics(
        rl_start_task_accuracy=(0.8, 0.72, 0.86, 120), rl_gain=(0.1, 0.05, 0.15, 120)
    )
    version = _new_version(uri, logged)
    assert promotion.promote(uri, logged.name, version, improved, config, "policy", JUDGES).promoted
    page = MlflowClient(uri).get_model_version(logged.name, version).description
    assert "- RL stage over its start: task accuracy gain +0.100 [0.050, 0.150] n=120" in page
    assert "nothing measurable" not in page
