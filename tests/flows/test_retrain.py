"""The retraining flow end to end against a real ``mlflow server`` process (REST API).

One module-scoped workspace: a first run makes the champion, a second unchanged run
retrains nothing, a third run with a sabotaged policy config is rejected by the gates. What
the MLflow UI shows of them (parent runs as comparable rows, decisions on the version pages,
cache hits as child runs) is read back through the MLflow API.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.cli.pipeline import console, render_summary
from alignflow.config import load_config
from alignflow.data.versioning import current_version
from alignflow.evaluation import cost
from alignflow.evaluation import metric_names as names
from alignflow.flows.retrain import GOLDEN_VERSION_TAG, STOP_REASON_TAG, retrain
from alignflow.flows.unchanged import OUTCOME_TAG as PIPELINE_OUTCOME_TAG
from alignflow.flows.unchanged import check_before_flow
from alignflow.registry.models import CHALLENGER, CHAMPION, alias_version
from alignflow.registry.pipeline_record import (
    CACHE_HIT_TAG,
    PIPELINE_TAG,
    REUSED_PIPELINE_TAG,
    REUSED_RUN_TAG,
)
from alignflow.registry.promotion import FAILED_GATES_TAG, OUTCOME_FAILED_TAG, OUTCOME_TAG, PROMOTED_AT_TAG
from alignflow.registry.runs import DATA_VERSION_TAG, child_runs
from alignflow.registry.server import local_mlflow_server
from tests.flows.conftest import FAST_OVERRIDES
from tests.flows.prefect_reads import read_flow_run, run_logs

pytestmark = pytest.mark.slow
TRAINING_STAGES = ("sft", "reward", "policy", "evaluate")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with local_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as running:
        yield running


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("repo")


def flow_overrides(server, *extra: str) -> list[str]:
    overrides = [*FAST_OVERRIDES, "project=demo", f"tracking.uri={server.url}", *extra]
    # the first model only has to be sound (the gates that guard champion are tested below)
    overrides.append("promotion.min_win_rate_vs_reference=null")
    return overrides


def run_flow(server, workspace, *extra: str) -> dict:
    return retrain(None, flow_overrides(server, *extra), repo_dir=str(workspace))


def flow_run_count() -> int:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.count_flow_runs()


@pytest.fixture(scope="module")
def first(server, workspace):
    return run_flow(server, workspace)


def stage_runs(uri: str, parent_run_id: str) -> dict[str, Run]:
    return {run.info.run_name: run for run in child_runs(uri, parent_run_id)}


def cache_hit_runs(uri: str, parent_run_id: str) -> dict[str, Run]:
    runs = stage_runs(uri, parent_run_id)
    return {name: run for name, run in runs.items() if run.data.tags.get(CACHE_HIT_TAG)}


def assert_a_comparable_row(parent: Run, server, data_version: str, workspace: Path) -> None:
    """A parent run as the MLflow UI lists it: named, config as params, its data as dataset."""
    assert parent.info.run_name == f"demo-dpo-{data_version[:7]}"
    assert parent.data.tags[PIPELINE_TAG] == "retrain"
    params, config = parent.data.params, load_config(None, flow_overrides(server))
    assert params["dpo.beta"] == str(config.dpo.beta) and params["model.name"] == config.model.name
    assert params["policy.algorithm"] == "dpo" and params["data.demo_rows"] == "1000"
    assert "tracking.uri" not in params
    (dataset,) = parent.inputs.dataset_inputs
    assert dataset.dataset.digest == data_version, "the DVC md5"
    assert str(workspace.resolve() / "data") in dataset.dataset.source


def assert_headline_results(parent: Run, evaluated: dict[str, float]) -> None:
    """Pinned-set accuracy, every pinned win rate, length ratio and reward accuracy with their
    intervals, and the KL: the evaluation's own figures, on the parent."""
    metrics = parent.data.metrics
    rates = [k for k in evaluated if k.startswith(f"{names.GOLDEN}/") and names.is_win_rate(k)]
    assert rates, evaluated
    for key in (names.TASK_ACCURACY, names.LENGTH_GROWTH_RATIO, names.REWARD_ACCURACY, *rates):
        for shown in (key, f"{key}/low", f"{key}/high"):
            assert metrics[shown] == pytest.approx(evaluated[shown]), shown
    assert metrics[names.KL_TO_REFERENCE] == pytest.approx(evaluated[names.KL_TO_REFERENCE])
    assert not any(k.startswith(f"{names.EVAL}/reward_") for k in metrics), "headline figures only"


def test_first_run_tracks_every_stage_and_registers_both_models(first, server):
    client = MlflowClient(server.url)
    parent = client.get_run(first["parent_run_id"])
    assert parent.data.tags[DATA_VERSION_TAG] == first["data_version"]
    assert {"git.commit", "config.hash"} <= set(parent.data.tags)
    stages = {run.data.tags.get("mlflow.runName") for run in child_runs(server.url, parent.info.run_id)}
    assert {"data", *TRAINING_STAGES, "register", "promote"} <= stages
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"data", "summary.json"} <= artifacts
    runs = child_runs(server.url, parent.info.run_id)
    evaluate_run = next(r for r in runs if r.info.run_name == "evaluate")
    eval_files = {a.path for a in client.list_artifacts(evaluate_run.info.run_id, "eval")}
    assert "eval/eval_report.json" in eval_files
    assert "eval/win_rate_vs_reference" in evaluate_run.data.metrics
    for role in ("policy", "reward"):
        assert alias_version(server.url, f"demo-{role}", CHALLENGER) == "1"
        version = client.get_model_version(f"demo-{role}", "1")
        assert version.tags[GOLDEN_VERSION_TAG] == first["golden"]["version"], "judged on the pinned set"
    assert first["promotions"]["policy"]["promoted"], first["promotions"]
    assert alias_version(server.url, "demo-policy", CHAMPION) == "1"
    assert first["golden"]["answers"] >= 100, "enough pinned prompts for the intervals to mean something"


def test_the_parent_run_is_one_comparable_row_of_config_results_and_data(first, server, workspace):
    parent = MlflowClient(server.url).get_run(first["parent_run_id"])
    assert_a_comparable_row(parent, server, first["data_version"], workspace)
    evaluated = next(s for s in first["stages"] if s["name"] == "evaluate")["metrics"]
    assert_headline_results(parent, evaluated)
    for role, decision in first["promotions"].items():
        assert parent.data.metrics[names.promoted_key(role)] == float(decision["promoted"])
    assert not cache_hit_runs(server.url, first["parent_run_id"]), "everything ran"


def test_a_version_page_explains_its_decision_and_the_promote_run_keeps_the_gate_table(first, server):
    client = MlflowClient(server.url)
    champion = client.get_model_version("demo-policy", "1")
    page = champion.description
    assert page.startswith("**Promoted to champion: all "), page
    assert "| gate | value | 95% interval | n | needed bound | outcome |" in page
    assert "| task_accuracy_gain | " in page and "| lower bound > 0 | passed |" in page
    assert f"Judges that counted: verifiable answers ({first['golden']['answers']} pinned prompts)" in page
    assert f"`{first['data_version']}`" in page and f"`{first['golden']['version']}`" in page
    assert f"[`{first['parent_run_id']}`](#/experiments/" in page, "a link to the pipeline run"
    assert champion.tags[OUTCOME_TAG] == "promoted"
    assert datetime.fromisoformat(champion.tags[PROMOTED_AT_TAG]).tzinfo is not None, "ISO 8601, not epoch"

    promote = stage_runs(server.url, first["parent_run_id"])["promote"]
    metrics = promote.data.metrics
    assert metrics["promoted/policy"] == 1.0
    gate = names.gate_key("policy", "task_accuracy_gain")
    assert metrics[f"{gate}/passed"] == 1.0 and metrics[f"{gate}/low"] > metrics[f"{gate}/threshold"]
    files = {a.path for a in client.list_artifacts(promote.info.run_id, "promotion")}
    tables = {f"promotion/{role}-gates.{ext}" for role in ("policy", "reward") for ext in ("md", "json")}
    assert tables <= files


def test_every_stage_run_logs_its_cost_the_parent_the_totals_and_the_version_page_its_price(first, server):
    client = MlflowClient(server.url)
    runs = stage_runs(server.url, first["parent_run_id"])
    for name, run in runs.items():
        assert run.data.metrics[cost.WALL_SECONDS] > 0 and run.data.metrics[cost.CPU_SECONDS] > 0, name
    config = load_config(None, flow_overrides(server))
    batches = {"sft": config.sft, "reward": config.reward, "policy": config.dpo}
    for name, stage in batches.items():
        metrics = runs[name].data.metrics
        steps = metrics[f"{'dpo' if name == 'policy' else name}/global_step"]
        rows = steps * stage.per_device_train_batch_size
        assert metrics[cost.TOKENS_TRAINED] >= rows, "a token a row at least"
        assert 0 < metrics[cost.MFU] < 1 and metrics[cost.PEAK_GFLOPS] > 0, name
        assert runs[name].data.tags[cost.DEVICE_TAG], name
    assert cost.TOKENS_TRAINED not in runs["evaluate"].data.metrics, "evaluation trains nothing"

    parent = client.get_run(first["parent_run_id"]).data.metrics
    spent = cost.totals(run.data.metrics for run in runs.values())
    for key in (cost.WALL_SECONDS, cost.CPU_SECONDS, cost.TOKENS_TRAINED):
        assert parent[key] == pytest.approx(spent[key]), key

    # the page was written while the promote stage ran: the stages before it are its cost
    before = cost.totals(run.data.metrics for name, run in runs.items() if name != "promote")
    gain = runs["evaluate"].data.metrics[names.TASK_ACCURACY_GAIN]
    policy_page = client.get_model_version("demo-policy", "1").description
    assert f"- {cost.cost_line(before, gain)}\n" in policy_page
    assert "CPU-minutes per +0.01 task accuracy over the reference" in policy_page
    reward_page = client.get_model_version("demo-reward", "1").description
    assert f"- {cost.cost_line(before)}\n" in reward_page, "the run's cost; its gain is the policy's"


def test_unchanged_rerun_retrains_nothing(first, server, workspace):
    second = run_flow(server, workspace)
    assert second["data_version"] == first["data_version"]
    assert second["nothing_to_do"], "the champion was trained on this data and config"
    by_name = {s["name"]: s for s in second["stages"]}
    assert {"data", *TRAINING_STAGES} <= set(by_name)
    assert all(s["cached"] and s["compute_seconds"] == 0 for s in second["stages"]), second["stages"]
    first_metrics = {s["name"]: s["metrics"] for s in first["stages"]}
    assert by_name["evaluate"]["metrics"] == first_metrics["evaluate"], "hits report the champion's figures"
    parent = MlflowClient(server.url).get_run(second["parent_run_id"])
    assert parent.data.tags[PIPELINE_OUTCOME_TAG] == "nothing_to_do"
    assert MlflowClient(server.url).search_model_versions("name='demo-policy'")[0].version in (1, "1")
    assert_a_comparable_row(parent, server, second["data_version"], workspace)
    assert_headline_results(parent, first_metrics["evaluate"])
    hits = cache_hit_runs(server.url, second["parent_run_id"])
    produced = stage_runs(server.url, first["parent_run_id"])
    for stage in TRAINING_STAGES:
        assert hits[stage].data.tags[REUSED_RUN_TAG] == produced[stage].info.run_id, stage


def test_unchanged_run_is_recognised_before_any_prefect_flow_run(first, server, workspace):
    runs_before = flow_run_count()
    summary = check_before_flow(load_config(None, flow_overrides(server)), workspace)
    assert flow_run_count() == runs_before, "the check must not need the Prefect API"
    assert summary is not None and summary.nothing_to_do
    assert summary.data_version == first["data_version"]
    assert all(stage.cached for stage in summary.stages)
    assert {"data", *TRAINING_STAGES} <= {stage.name for stage in summary.stages}
    recorded = MlflowClient(server.url).get_run(summary.parent_run_id)
    assert recorded.data.tags[PIPELINE_OUTCOME_TAG] == "nothing_to_do"
    assert recorded.data.tags[DATA_VERSION_TAG] == first["data_version"]
    assert_a_comparable_row(recorded, server, first["data_version"], workspace)
    assert set(TRAINING_STAGES) <= set(cache_hit_runs(server.url, summary.parent_run_id))
    assert "summary.json" in {a.path for a in MlflowClient(server.url).list_artifacts(summary.parent_run_id)}
    changed = load_config(None, flow_overrides(server, "dpo.beta=0.2"))
    assert check_before_flow(changed, workspace) is None, "a changed config is work to do"


def test_cli_run_shows_the_cache_hits_when_nothing_changed(first, server, workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    sets = [arg for override in flow_overrides(server) for arg in ("--set", override)]
    result = CliRunner().invoke(app, ["run", *sets, "--summary-json", "rerun.json"])
    assert result.exit_code == 0, result.output
    assert "Nothing to do" in result.output and "hit" in result.output
    summary = json.loads((workspace / "rerun.json").read_text())
    assert summary["nothing_to_do"] and all(stage["cached"] for stage in summary["stages"])


def registered_versions(uri: str, name: str) -> set[str]:
    return {str(v.version) for v in MlflowClient(uri).search_model_versions(f"name='{name}'")}


def assert_the_flow_run_tells_the_rejection(summary: dict, version: str) -> None:
    """The Prefect flow run of a rejected challenger: tagged so, the failed gate in its logs."""
    run = read_flow_run(summary["flow_run_id"])
    assert run.name == f"demo-dpo-{summary['data_version'][:7]}"
    expected = {"project:demo", "algorithm:dpo", "outcome:not_promoted", "policy:rejected", "reward:reused"}
    assert expected <= set(run.tags), run.tags
    logs = run_logs(summary["flow_run_id"])
    said = [message for name, _, message in logs if name.startswith("alignflow.flows.")]
    verdict = f"demo-policy v{version}: not promoted (failed: "
    assert any(s.startswith(verdict) and "task_accuracy_vs_champion" in s for s in said), said
    assert any(re.match(r"  gate (?!passed)\w+ task_accuracy_vs_champion: ", s) for s in said), said
    assert said[-1].startswith("outcome: ") and f"demo-policy v{version} not promoted" in said[-1]


def test_cached_stages_are_reused_when_only_the_policy_changes(first, server, workspace):
    reward_versions = registered_versions(server.url, "demo-reward")
    worse = run_flow(server, workspace, "dpo.learning_rate=0.5", "dpo.max_steps=20")
    by_name = {s["name"]: s for s in worse["stages"]}
    assert by_name["sft"]["cached"] and by_name["reward"]["cached"]
    assert not by_name["policy"]["cached"]
    decision = worse["promotions"]["policy"]
    assert not decision["promoted"], decision
    assert alias_version(server.url, "demo-policy", CHAMPION) == "1"
    rejected = MlflowClient(server.url).get_model_version("demo-policy", decision["version"])
    failed = json.loads(rejected.tags[FAILED_GATES_TAG])
    assert "task_accuracy_vs_champion" in failed, failed
    assert "reward" in decision["judges"], "the reused champion reward model still judges"
    assert rejected.tags[OUTCOME_TAG] == "rejected"
    assert "task_accuracy_vs_champion" in rejected.tags[OUTCOME_FAILED_TAG].split(",")
    said = rejected.description.splitlines()[0]  # the version page: the decision first
    assert said.startswith("**Not promoted (failed: ") and "task_accuracy_vs_champion" in said, said
    assert said.endswith("champion stays version 1.**"), said
    assert "| task_accuracy_vs_champion | " in rejected.description
    assert_the_flow_run_tells_the_rejection(worse, decision["version"])

    # the cache-hit reward model is not registered again: same versions, champion unmoved
    assert registered_versions(server.url, "demo-reward") == reward_versions
    assert alias_version(server.url, "demo-reward", CHAMPION) == "1"
    reused = worse["promotions"]["reward"]
    assert reused["reused"] and str(reused["version"]) == "1", reused
    assert reused["produced_by_run"] == first["parent_run_id"]
    tags = MlflowClient(server.url).get_run(worse["parent_run_id"]).data.tags
    assert tags["reward.reused_from_run"] == first["parent_run_id"]
    assert tags["reward.reused_version"] == "1"
    assert "policy.reused_from_run" not in tags

    # the cache hits show under the new parent, each pointing at the run that did the work
    hits = cache_hit_runs(server.url, worse["parent_run_id"])
    assert {"sft", "reward"} <= set(hits) and "policy" not in hits, sorted(hits)
    produced = stage_runs(server.url, first["parent_run_id"])["reward"].info.run_id
    assert hits["reward"].data.tags[REUSED_RUN_TAG] == produced
    assert hits["reward"].data.tags[REUSED_PIPELINE_TAG] == first["parent_run_id"]
    assert produced in hits["reward"].data.tags[MLFLOW_RUN_NOTE], "the description links the producer"
    assert hits["reward"].data.metrics == by_name["reward"]["metrics"], "its figures, side by side"
    # this run paid for the policy's tokens only; its page counts the reused stages at their cost
    parent = MlflowClient(server.url).get_run(worse["parent_run_id"]).data.metrics
    policy_run = stage_runs(server.url, worse["parent_run_id"])["policy"]
    assert parent[cost.TOKENS_TRAINED] == policy_run.data.metrics[cost.TOKENS_TRAINED]
    said = next(line for line in rejected.description.splitlines() if line.startswith("- Cost: "))
    assert f"({', '.join(sorted(hits))} reused from earlier runs, counted at what they cost there)" in said
    with console.capture() as shown:
        render_summary(worse)
    text = " ".join(shown.get().split())  # the console wraps at its width
    assert (
        f"demo-reward v1: reused, unchanged (decided by run {first['parent_run_id']}); it stays champion"
        in text
    )


def test_a_poisoned_data_version_stops_before_training_and_the_champion_stays(first, server, workspace):
    rows = [json.loads(line) for line in (workspace / ".alignflow" / "demo-input" / "demo.jsonl").open()]
    swapped = workspace / "swapped.jsonl"
    with swapped.open("w") as out:
        for row in rows:
            if "chosen" in row:
                row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
            out.write(json.dumps(row) + "\n")
    versions_before = len(MlflowClient(server.url).search_model_versions("name='demo-policy'"))
    stopped = run_flow(server, workspace, f"data.source={swapped}")
    assert stopped["stopped"]["reason"] == "label_disagreement", stopped
    assert not stopped["promotions"] and {s["name"] for s in stopped["stages"]} <= {"data"}
    parent = MlflowClient(server.url).get_run(stopped["parent_run_id"])
    assert parent.data.tags[PIPELINE_OUTCOME_TAG] == "stopped"
    assert parent.data.tags[STOP_REASON_TAG] == "label_disagreement"
    report = json.loads(Path(stopped["stopped"]["report"]).read_text())
    assert not report["passed"] and report["examples"], "the report shows disagreeing pairs"
    assert len(MlflowClient(server.url).search_model_versions("name='demo-policy'")) == versions_before
    assert alias_version(server.url, "demo-policy", CHAMPION) == "1"
    assert current_version(workspace, "data") == first["data_version"], "nothing was versioned"


def test_ppo_policy_runs_end_to_end_on_the_trained_reward_model(first, server, workspace):
    ppo = run_flow(
        server, workspace, "policy.algorithm=ppo", "ppo.max_steps=6", "ppo.per_device_train_batch_size=8"
    )
    by_name = {s["name"]: s for s in ppo["stages"]}
    assert by_name["sft"]["cached"] and by_name["reward"]["cached"]
    assert not by_name["policy"]["cached"]
    assert "policy" in ppo["promotions"] and "reward" in ppo["promotions"]
    version = ppo["promotions"]["policy"]["version"]
    run_id = MlflowClient(server.url).get_model_version("demo-policy", version).run_id
    assert run_id, "the PPO policy is registered from its stage run"
    policy_run = next(r for r in child_runs(server.url, ppo["parent_run_id"]) if r.info.run_name == "policy")
    assert any(key.startswith("train/") for key in policy_run.data.metrics), policy_run.data.metrics


def test_a_toy_algorithm_from_the_registry_alone_runs_as_the_policy(first, server, workspace, toy_stage):
    """Last in the module: the versions it registers could change the champion for later tests."""
    toy = run_flow(server, workspace, "policy.algorithm=toy", "toy.max_steps=2")
    by_name = {s["name"]: s for s in toy["stages"]}
    assert by_name["sft"]["cached"] and by_name["reward"]["cached"], "only the policy step reads toy"
    assert not by_name["policy"]["cached"] and by_name["policy"]["metrics"]["global_step"] == 2.0
    assert "policy" in toy["promotions"], "evaluated, registered and judged like any policy"
    same = run_flow(server, workspace, "policy.algorithm=toy", "toy.max_steps=2")
    assert {s["name"]: s for s in same["stages"]}["policy"]["cached"]
    retuned = run_flow(server, workspace, "policy.algorithm=toy", "toy.max_steps=3")
    policy = {s["name"]: s for s in retuned["stages"]}["policy"]
    assert not policy["cached"] and policy["metrics"]["global_step"] == 3.0, "toy's section keys its cache"
