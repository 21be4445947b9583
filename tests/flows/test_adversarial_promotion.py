"""The promotion gates under attack: six bad challengers rejected, a better one promoted.

Runs ``bench/promotion_bench.py``'s suite against a real MLflow registry (sqlite) and the
Prefect test API: the champion is the embedded default (the demo), every challenger is
judged on the pinned set by judges outside its own run, and the registry's tags must name
the gates that stopped each bad one.
"""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from alignflow.registry.models import CHAMPION, alias_version
from alignflow.registry.promotion import FAILED_GATES_TAG, GATE_TAG_PREFIX, GATES_TAG
from bench.promotion_bench import BETTER, run_suite, to_markdown

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("redteam")
    return workspace, run_suite(workspace)


def _by_label(rows):
    return {row.label: row for row in rows}


def test_the_champion_is_a_policy_that_does_the_task(suite):
    _, rows = suite
    champion = _by_label(rows)["champion: the demo"]
    assert champion.decision == "promoted"
    assert champion.accuracy is not None and champion.accuracy >= 0.9


@pytest.mark.parametrize(
    ("label", "gate"),
    [
        ("randomly initialised policy", "task_accuracy_gain"),
        ("copy of the SFT reference", "task_accuracy_gain"),
        ("length-hacked policy (answers padded with filler)", "length_growth_vs_champion"),
        ("degenerate policy (repeats one token)", "task_accuracy_vs_champion"),
        ("policy trained on label-flipped data", "task_accuracy_vs_champion"),
        ("reward model trained on flipped labels", "reward_accuracy"),
    ],
)
def test_each_bad_challenger_is_rejected_with_its_failed_gates_in_the_registry(suite, label, gate):
    workspace, rows = suite
    row = _by_label(rows)[label]
    assert row.decision == "rejected", row
    name = f"redteam-{row.role}"
    tags = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}").get_model_version(name, row.version).tags
    failed = json.loads(tags[FAILED_GATES_TAG])
    assert gate in failed, failed
    assert failed[gate]["n"] is None or failed[gate]["n"] >= 30, "judged on the pinned set, not a handful"
    assert tags[GATE_TAG_PREFIX + gate].startswith(failed[gate]["outcome"])
    assert json.loads(tags[GATES_TAG]), "every gate is recorded, passed or not"


def test_six_of_six_bad_challengers_rejected_and_the_better_one_promoted(suite):
    workspace, rows = suite
    bad = [r for r in rows if r.expected == "rejected"]
    assert len(bad) == 6 and all(r.decision == "rejected" for r in bad), [(r.label, r.decision) for r in bad]
    better = _by_label(rows)[BETTER]
    assert better.decision == "promoted", better.gates
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    assert alias_version(uri, "redteam-policy", CHAMPION) == better.version
    table = to_markdown(rows)
    assert table.count("| rejected | yes |") == 6 and "**no**" not in table
