"""The scheduled A/B check: the same human gate as ``promote --human``, as a Prefect flow run."""

from __future__ import annotations

import pytest

from alignflow.flows.ab_check import ab_check
from alignflow.registry import models
from tests.service.test_ab import AGENT, HEADERS, service, simulate_users, two_versions  # noqa: F401

pytestmark = pytest.mark.slow


def test_the_scheduled_check_promotes_a_clearly_preferred_challenger(tmp_path, two_versions):  # noqa: F811
    uri = two_versions
    name = models.registered_name(AGENT, "policy")
    database = f"sqlite:///{tmp_path / 'service.db'}"
    with service(tmp_path, uri) as client:
        before = ab_check(AGENT, database, uri, overrides=["promotion.min_judged_rows=20"])
        assert before["judged"] and not before["promoted"]  # no ratings yet: insufficient evidence
        client.put(f"/api/policies/traffic/{AGENT}", json={"challengerShare": 0.5}, headers=HEADERS)
        simulate_users(client, better="v2")
    after = ab_check(AGENT, database, uri, overrides=["promotion.min_judged_rows=20"])
    assert after == {**after, "judged": True, "promoted": True, "version": "2"}
    assert models.alias_version(uri, name, models.CHAMPION) == "2"
    # nothing left to compare: the champion has no different challenger
    assert ab_check(AGENT, database, uri)["judged"] is False
