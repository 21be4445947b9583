"""A version's page shows its decision, not a hundred metrics (issue #48).

The metrics a version is judged on stay metrics, on the run that logged it; its tags keep
what a person reads (the decision and why, the gates, the judges, the lineage). Judging a
challenger against the champion later reads the metrics back from those runs.
"""

from __future__ import annotations

from mlflow import MlflowClient

from alignflow.promotion import gates
from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.registry import models, promotion
from tests.registry.conftest import FIRST_POLICY, MATCHES_CHAMPION, pinned_metrics

NAME = "tags-policy"
JUDGES = ["champion_reward"]
# the decision, its reason and time, the gate table, one line per gate, judges, lineage: a page's worth
MAX_VERSION_TAGS = 40
REGRESSION = MATCHES_CHAMPION | pinned_metrics(task_accuracy_vs_champion=(-0.5, -0.6, -0.4, 120))


def _version(client: MlflowClient, tmp_path, tags: dict[str, str]) -> tuple[str, str]:
    """A version logged by a run of its own (no model files: promotion reads metrics and tags)."""
    run_id = client.create_run("0").info.run_id
    source = (tmp_path / run_id).as_uri()
    return str(client.create_model_version(NAME, source, run_id=run_id, tags=tags).version), run_id


def test_judged_versions_keep_metrics_on_their_runs_and_a_readable_set_of_tags(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    client.create_registered_model(NAME)
    lineage = {"data.version": "d1", "config.hash": "c1"}
    first, _ = _version(client, tmp_path, lineage)
    second, second_run = _version(client, tmp_path, lineage)
    config = PromotionConfig()

    assert promotion.promote(uri, NAME, first, FIRST_POLICY, config, "policy", JUDGES).promoted
    rejected = promotion.promote(uri, NAME, second, REGRESSION, config, "policy", JUDGES)
    assert not rejected.promoted
    assert "task_accuracy_vs_champion" in {r.name for r in rejected.failed}
    assert models.alias_version(uri, NAME, models.CHAMPION) == first

    for version, outcome in ((first, "promoted"), (second, "rejected")):
        tags = client.get_model_version(NAME, version).tags
        assert not [tag for tag in tags if tag.startswith("metric.")]
        assert len(tags) <= MAX_VERSION_TAGS, sorted(tags)
        assert tags[promotion.OUTCOME_TAG] == outcome and tags[promotion.OUTCOME_REASON_TAG]
        assert tags["data.version"] == "d1"
    assert client.get_run(second_run).data.metrics == REGRESSION


def test_a_challenger_is_judged_again_against_the_champion_from_its_runs_metrics(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    client.create_registered_model(NAME)
    first, _ = _version(client, tmp_path, {})
    second, _ = _version(client, tmp_path, {})
    config = PromotionConfig()
    promotion.promote(uri, NAME, first, FIRST_POLICY, config, "policy", JUDGES)
    promotion.promote(uri, NAME, second, REGRESSION, config, "policy", JUDGES)

    recorded = promotion.recorded_metrics(uri, NAME, second)
    assert recorded == REGRESSION
    again = gates.decide(NAME, second, recorded, config, "policy", first, JUDGES)
    assert not again.promoted and "task_accuracy_vs_champion" in {r.name for r in again.failed}
    assert promotion.recorded_metrics(uri, NAME, first) == FIRST_POLICY
