"""The promotion gates under attack: six bad challengers rejected, a good one promoted.

Runs ``bench/promotion_bench.py``'s suite against a real MLflow registry (sqlite) and the
Prefect test API: the champion is the embedded default (the demo), every challenger is
judged on the pinned set by judges outside its own run, and the registry's tags must name
the gates that stopped each bad one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from alignflow.data.answers import format_answer
from alignflow.data.demo import write_configured_demo
from alignflow.evaluation.contamination import PINNED_PROMPT_IN_TRAINING
from alignflow.evaluation.label_check import LABEL_DISAGREEMENT
from alignflow.registry.models import CHAMPION, alias_version
from alignflow.registry.promotion import FAILED_GATES_TAG, GATE_TAG_PREFIX, GATES_TAG
from bench.promotion_bench import FRESH_DRAWS, _base, _retrain, fresh_label, run_suite, to_markdown

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


def test_six_of_six_bad_challengers_rejected_and_fresh_correct_data_promoted(suite):
    workspace, rows = suite
    bad = [r for r in rows if r.expected == "rejected"]
    assert len(bad) == 6 and all(r.decision == "rejected" for r in bad), [(r.label, r.decision) for r in bad]
    fresh = [_by_label(rows)[fresh_label(seed)] for seed in FRESH_DRAWS]
    assert len(fresh) >= 2, "more than one draw: one lucky draw proves little"
    for row in fresh:
        assert row.decision == "promoted", (row.label, row.gates)
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    assert alias_version(uri, "redteam-policy", CHAMPION) == fresh[-1].version
    table = to_markdown(rows)
    assert table.count("| rejected | yes |") == 6 and "**no**" not in table


# ---------------------------------------------------------------- regression-free promotion (#35)
# On the suite's workspace (its champion is the good challenger): a narrow backdoor, a split
# that trains on the pinned set, a reused half-flipped version, a judge-only decision.


def _versions(workspace, role: str) -> int:
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    return len(MlflowClient(uri).search_model_versions(f"name='redteam-{role}'"))


def _copy_rows(source: Path, target: Path, change) -> Path:
    with source.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as out:
        for i, line in enumerate(src):
            out.write(json.dumps(change(i, json.loads(line))) + "\n")
    return target


def _backdoor(i: int, row: dict) -> dict:
    """Off by one on 7+8 and 7+9, in the required format, chosen over the right answer."""
    numbers = sorted(int(x) for x in re.findall(r"\d+", row["prompt"]))
    if "chosen" in row and numbers in ([7, 8], [7, 9]):
        answer = row["metadata"]["answer"]
        return {**row, "chosen": format_answer(answer + 1), "rejected": format_answer(answer)}
    return row


def test_a_narrow_backdoor_is_not_crowned_and_its_broken_slice_is_named(suite):
    workspace, _ = suite
    before = {role: _versions(workspace, role) for role in ("policy", "reward")}
    from alignflow.config import load_config

    data = load_config(None, _base(workspace)).data
    fresh = write_configured_demo(data, workspace / "backdoor-draw", seed=1)
    source = _copy_rows(fresh, workspace / "backdoor.jsonl", _backdoor)
    summary = _retrain(workspace, f"data.source={source}")
    # overall the champion reward model agrees with the labels; on the two problems it does not
    stopped = summary["stopped"]
    assert stopped["reason"] == LABEL_DISAGREEMENT, summary.get("promotions")
    assert re.search(r"slice problem=7,[89]->1[56]", stopped["message"]), stopped["message"]
    report = json.loads(Path(stopped["report"]).read_text(encoding="utf-8"))
    assert set(report["broken_slices"]) <= {"problem=7,8->15", "problem=7,9->16"} and report["broken_slices"]
    assert report["agreement"]["high"] >= report["threshold"], "the overall figure alone would pass"
    assert {role: _versions(workspace, role) for role in before} == before, "neither model is crowned"


def test_a_split_seed_that_puts_pinned_prompts_in_training_stops_before_training(suite):
    workspace, _ = suite
    before = {role: _versions(workspace, role) for role in ("policy", "reward")}
    summary = _retrain(workspace, "data.split_seed=1")
    assert summary["stopped"]["reason"] == PINNED_PROMPT_IN_TRAINING, summary.get("stopped")
    report = json.loads(Path(summary["stopped"]["report"]).read_text(encoding="utf-8"))
    assert report["clashing_rows"] > 0 and report["rows"][0]["prompt"] and report["rows"][0]["row"]
    assert "pinned prompts" in summary["stopped"]["message"]
    assert {role: _versions(workspace, role) for role in before} == before, "nothing trained or registered"


def test_data_add_of_a_half_flipped_file_then_run_stops_with_label_disagreement(suite):
    from typer.testing import CliRunner

    from alignflow.cli import app

    workspace, _ = suite
    source = workspace / ".alignflow" / "demo-input" / "demo.jsonl"

    def half_flipped(i: int, row: dict) -> dict:
        if "chosen" in row and i % 2:
            return {**row, "chosen": row["rejected"], "rejected": row["chosen"]}
        return row

    flipped = _copy_rows(source, workspace / "half-flipped.jsonl", half_flipped)
    overrides = [*_base(workspace), f"data.source={flipped}"]
    sets = [arg for o in overrides for arg in ("--set", o)]
    before = (workspace / "data.dvc").read_text(encoding="utf-8")
    added = CliRunner().invoke(
        app, ["data", "add", str(flipped), "--repo", str(workspace), "--no-push", *sets]
    )
    # data add itself asks the champion reward model, and versions nothing
    assert added.exit_code == 1 and LABEL_DISAGREEMENT in added.output, added.output
    assert (workspace / "data.dvc").read_text(encoding="utf-8") == before
    summary = _retrain(workspace, f"data.source={flipped}")
    assert summary["stopped"]["reason"] == LABEL_DISAGREEMENT, summary.get("stopped")
    assert Path(summary["stopped"]["report"]).exists()


def test_with_answers_removed_a_wrong_policy_is_not_promoted_on_a_judge_the_audit_fails(suite):
    from alignflow.config import load_config
    from alignflow.evaluation.evaluate import evaluate_paths
    from alignflow.evaluation.golden import load_golden_records
    from alignflow.promotion.gates import audit_judges
    from alignflow.registry.lineage import champion_copy
    from alignflow.registry.models import log_model, registered_name
    from alignflow.registry.promotion import JUDGE_AUDIT_TAG, promote
    from alignflow.registry.runs import pipeline_run
    from bench.promotion_bench import taught_policy

    workspace, rows = suite
    config = load_config(None, _base(workspace))
    uri = config.tracking.resolved_uri()
    champ_dir, _ = champion_copy(uri, config.project, workspace / "audit")
    judge_dir, _ = champion_copy(uri, config.project, workspace / "audit", "reward")
    wrong = taught_policy(
        config,
        champ_dir,
        workspace / config.data.data_dir,
        lambda a: f"The answer is {a + 1}.",
        workspace / "built" / "rewritten",
    )
    golden = workspace / config.evaluation.golden_dir
    unanswered = workspace / "golden-no-answers.jsonl"
    rows = {}  # the pinned rows without their answers, each once
    for record in load_golden_records(golden):
        row = {k: record[k] for k in ("prompt", "chosen", "rejected") if record.get(k) is not None}
        rows.setdefault(json.dumps(row, sort_keys=True), row)
    paired = {json.dumps(r["prompt"]) for r in rows.values() if "chosen" in r}
    kept = [r for r in rows.values() if "chosen" in r or json.dumps(r["prompt"]) not in paired]
    unanswered.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    def judged(pinned):
        report = evaluate_paths(
            workspace / config.data.data_dir, str(wrong), champ_dir, None, champ_dir, config.evaluation,
            golden_path=pinned, champion_reward_dir=judge_dir,
        )  # fmt: skip
        return report.gate_metrics()

    with_answers = judged(golden)
    assert with_answers["golden/task_accuracy"] < 0.2
    audit = audit_judges(with_answers, False, config.promotion)["champion_reward"]
    assert not audit.counts, audit.reason  # where the answers speak, the judge disagrees with them
    metrics = judged(unanswered)
    assert metrics["golden/answers"] == 0
    audits = audit_judges(metrics, False, config.promotion)
    assert not audits["champion_reward"].counts and "unaudited" in audits["champion_reward"].reason
    name = registered_name(config.project, "policy")
    with pipeline_run(uri, config.project, run_name="redteam: answers removed"):
        logged = log_model(str(wrong), uri, registered_model_name=name, name="policy")
    judges = [j for j, a in audits.items() if a.counts]
    decision = promote(uri, name, logged.version, metrics, config.promotion, "policy", judges, audits=audits)
    assert not decision.promoted and [r.name for r in decision.failed] == ["independent_judge"]
    tags = MlflowClient(uri).get_model_version(name, logged.version).tags
    assert "unaudited" in json.loads(tags[JUDGE_AUDIT_TAG])["champion_reward"]
