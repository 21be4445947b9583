"""What ``alignflow run`` shows while it works and what it leaves in the Prefect and MLflow UIs.

Two runs of the real CLI (subprocesses on the session's Prefect test API, MLflow in the
workspace) on the demo config made tiny, with gates a tiny model can pass:

1. under a pseudo-terminal, with the user's environment asking transformers and the hub
   for their warnings and bars: the live view, and nothing of theirs on the screen;
2. the same data with a changed policy config, stdout piped: plain lines, cache hits for
   the unchanged stages, and an evaluation against the champion the first run promoted;
3. another policy config, judged on more evidence than the pinned set holds: a rejection.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from alignflow.evaluation.plots import learning_curves
from alignflow.flows.artifacts import GATES_TABLE, artifact_key
from alignflow.flows.run_log import role_outcome
from alignflow.registry.decision_card import outcome_statement
from alignflow.registry.runs import child_runs
from alignflow.tasks.evaluation import COMPLETIONS_TABLE
from tests.cli.terminal import cli, noise_in, run_in_terminal, screen_lines
from tests.flows.conftest import TINY_FLOW
from tests.flows.prefect_reads import flow_runs_named, read_flow_run, run_logs

pytestmark = pytest.mark.slow
PROJECT = "watch-demo"
TINY = [*TINY_FLOW, f"project={PROJECT}", "dpo.max_steps=4"]
STAGES = ("data", "sft", "reward", "policy", "evaluate", "register", "promote")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("watch")


@pytest.fixture(scope="module")
def tracking_uri(workspace) -> str:
    return f"sqlite:///{workspace / 'mlflow.db'}"


@pytest.fixture(scope="module")
def env(workspace) -> dict[str, str]:
    """This session's Prefect test API, results and state in the workspace."""
    from prefect.settings import PREFECT_API_URL

    return {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(workspace / ".alignflow" / "prefect-results"),
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",
    }


def run_command(tracking_uri: str, summary: str, *extra: str) -> list[str]:
    sets = [arg for item in [*TINY, f"tracking.uri={tracking_uri}", *extra] for arg in ("--set", item)]
    return cli("run", *sets, "--summary-json", summary)


@pytest.fixture(scope="module")
def on_terminal(workspace, tracking_uri, env):
    """The first run, on a terminal, with the user asking the libraries to talk."""
    noisy = {**env, "TRANSFORMERS_VERBOSITY": "warning", "HF_HUB_DISABLE_PROGRESS_BARS": "0"}
    code, raw = run_in_terminal(run_command(tracking_uri, "first.json"), workspace, noisy)
    (workspace / "terminal.txt").write_text(raw, encoding="utf-8")  # for a look after a failure
    assert code == 0, raw[-4000:]
    return raw, json.loads((workspace / "first.json").read_text())


COMMAND_SECONDS: dict[str, float] = {}  # a piped run's wall, measured here, by its summary file


def piped_run(workspace, tracking_uri, env, out: str, *overrides: str) -> tuple[str, str, dict]:
    """A run on the workspace with stdout and stderr to pipes: what it printed and its summary."""
    started = time.monotonic()
    done = subprocess.run(
        run_command(tracking_uri, out, *overrides),
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    COMMAND_SECONDS[out] = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, done.stderr, json.loads((workspace / out).read_text())


@pytest.fixture(scope="module")
def piped(on_terminal, workspace, tracking_uri, env):
    """The second run (policy config changed), stdout and stderr to pipes."""
    return piped_run(workspace, tracking_uri, env, "second.json", "dpo.beta=0.2")


@pytest.fixture(scope="module")
def rejected(piped, workspace, tracking_uri, env):
    """A third run whose policy cannot pass (its gates ask for more judged rows than exist), piped."""
    stdout, _, summary = piped_run(
        workspace, tracking_uri, env, "third.json", "dpo.beta=0.3", "promotion.min_judged_rows=100000"
    )
    return stdout, summary


def summary_artifact(summary: dict) -> str:
    """The Prefect markdown summary of the run ``summary`` reports."""
    markdown = [a for a in read_artifacts(artifact_key(PROJECT, "retrain-summary")) if a.type == "markdown"]
    ours = [a.data for a in markdown if f"- MLflow parent run: `{summary['parent_run_id']}`" in a.data]
    assert len(ours) == 1, [a.data[:200] for a in markdown]
    return ours[0]


def test_the_live_view_shows_each_stage_and_its_steps_while_training(on_terminal):
    raw, summary = on_terminal
    lines = screen_lines(raw)
    view = [line for line in lines if re.search(r"\b(sft|reward|policy)\b.*step \d+/\d+", line)]
    for stage, total in (("sft", 30), ("reward", 10), ("policy", 4)):
        rows = [line for line in view if f" {stage} " in line]
        counts = {int(n) for line in rows for n in re.findall(rf"step (\d+)/{total}", line)}
        assert total in counts, f"{stage}: its steps {sorted(counts)}"
        if stage == "sft":  # long enough to be seen on its way, not only at its end
            assert any(0 < n < total for n in counts), f"sft: no step shown while training: {sorted(counts)}"
    assert any("steps/s" in line and "ETA" in line for line in view), "rate and ETA"
    running = [line for line in lines if "alignflow run — watch-demo" in line]
    assert running, "the live view's heading"
    assert "\x1b[" in raw and "\r" in raw, "drawn in place on a terminal"
    assert summary["promotions"]["policy"]["promoted"], summary["promotions"]


def test_without_a_terminal_each_event_is_one_plain_line(piped):
    stdout, _, summary = piped
    assert "\x1b[" not in stdout and "\r" not in stdout
    events = [line for line in stdout.splitlines() if re.match(r"^\[\s*[\dhms.]+\] ", line)]
    said = [line.split("] ", 1)[1] for line in events]
    assert said.index("data: started") < said.index("policy: started") < said.index("evaluate: started")
    # each stage's line says what the summary says: a cache hit (the data, unchanged; sft and
    # reward unless the library's code changed in between) or work done
    for stage in summary["stages"]:
        outcome = "cache hit" if stage["cached"] else "done"
        assert any(re.fullmatch(rf"{stage['name']}: {outcome} in [\d.]+s(, .*)?", s) for s in said), said
    assert next(s for s in summary["stages"] if s["name"] == "data")["cached"], "same input, same version"
    assert any(re.match(r"policy: step [1-3]/4, [\d.]+ steps/s, ETA", s) for s in said), said
    assert not next(s for s in summary["stages"] if s["name"] == "policy")["cached"], "its config changed"


def test_no_library_noise_reaches_the_terminal_and_the_log_file_keeps_it(on_terminal, piped, workspace):
    raw, _ = on_terminal
    stdout, stderr, _ = piped
    assert noise_in(raw) == [], "on the terminal"
    assert noise_in(stdout) == [] and noise_in(stderr) == [], "in the piped output"
    logs = sorted((workspace / ".alignflow" / "logs").glob("run-*.log"))
    assert len(logs) == 2
    assert "LOAD REPORT" in logs[0].read_text(), "the loader's note went to the log file, not away"
    assert f"log: {logs[1]}" in stdout.replace("\n", "")


def read_artifacts(key: str) -> list:
    """Every artifact with ``key``, newest first, from the Prefect API (``POST /artifacts/filter``).

    Through the client's transport: prefect 3.8's ``read_artifacts`` sends ``null`` for the
    filters left out, which its server refuses (422), and an empty task-run filter would
    keep only artifacts made by tasks, not the flow's own.
    """
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.objects import Artifact

    body = {
        "artifacts": ArtifactFilter(key=ArtifactFilterKey(any_=[key])).model_dump(
            mode="json", exclude_unset=True
        ),
        "sort": "CREATED_DESC",
        "limit": 50,
        "offset": 0,
    }
    with get_client(sync_client=True) as client:
        return Artifact.model_validate_list(client.request("POST", "/artifacts/filter", json=body).json())


@contextmanager
def tracking(uri: str) -> Iterator[None]:
    """``load_table`` finds runs through the global tracking URI."""
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


def test_prefect_holds_a_markdown_summary_and_a_stage_table_of_the_run(on_terminal):
    _, summary = on_terminal
    markdown = [a for a in read_artifacts(artifact_key(PROJECT, "retrain-summary")) if a.type == "markdown"]
    ours = [a for a in markdown if f"- MLflow parent run: `{summary['parent_run_id']}`" in a.data]
    assert len(ours) == 1, [a.data[:200] for a in markdown]
    text = ours[0].data
    assert "**Outcome:** watch-demo-reward v1 promoted to champion; watch-demo-policy v1 promoted" in text
    assert "| sft | " in text and "| evaluate | " in text, "every stage with its time and cache column"
    assert "| gate | outcome | value | 95% interval | n | needs |" in text
    assert re.search(r"\| independent_judge \| passed \| \d \|  \|  \| value >= 1 \|", text), text
    assert ours[0].flow_run_id is not None, "attached to the retrain flow run"
    tables = [a for a in read_artifacts(artifact_key(PROJECT, "retrain-stages")) if a.type == "table"]
    rows = json.loads(tables[0].data) if isinstance(tables[0].data, str) else tables[0].data
    assert [r["stage"] for r in rows] == list(STAGES)


def test_the_prefect_flow_run_is_named_and_tagged_and_logs_our_lines(on_terminal, piped, tracking_uri):
    """The Prefect UI's flow-run page: named as the MLflow parent run, tagged with what ran
    and what came of it, and our lines (each stage, the gates, the outcome) in its Logs tab."""
    for summary, reward in ((on_terminal[1], "promoted"), (piped[2], "reused")):
        run = read_flow_run(summary["flow_run_id"])
        parent = MlflowClient(tracking_uri).get_run(summary["parent_run_id"])
        short = summary["data_version"][:7]
        assert run.name == parent.info.run_name == f"{PROJECT}-dpo-{short}"
        assert {f"project:{PROJECT}", "algorithm:dpo", f"data:{short}", f"reward:{reward}"} <= set(run.tags)
        decision = summary["promotions"]["policy"]
        fate, outcome = ("promoted", "promoted") if decision["promoted"] else ("rejected", "not_promoted")
        assert {f"policy:{fate}", f"outcome:{outcome}"} <= set(run.tags)
        logs = run_logs(summary["flow_run_id"])
        said = [message for name, _, message in logs if name.startswith("alignflow.flows.")]
        for stage in summary["stages"]:
            outcome = "cache hit" if stage["cached"] else "done"
            assert f"{stage['name']}: started" in said, said
            assert any(re.fullmatch(rf"{stage['name']}: {outcome} in [\d.]+s(, .*)?", s) for s in said), said
        assert any(re.match(r"evaluate: done in .*pinned task_accuracy=", s) for s in said), said
        verdict = "promoted to champion" if decision["promoted"] else "not promoted (failed: "
        assert any(s.startswith(f"{PROJECT}-policy v{decision['version']}: {verdict}") for s in said), said
        assert any(re.match(r"  gate (passed|failed) independent_judge", s) for s in said), said
        assert said[-1].startswith(f"outcome: {PROJECT}-reward v1 "), said
    stage_runs = flow_runs_named(*(f"{PROJECT}-{stage}-{short}" for stage in ("sft", "reward", "policy")))
    assert len(stage_runs) == 6, "each stage's subflow run, in both runs, says what it trained on"
    assert all({f"project:{PROJECT}", "algorithm:dpo"} <= set(r.tags) for r in stage_runs)


def test_the_run_reports_the_time_it_spent_before_the_flow(piped, tracking_uri):
    """The flow's own wall leaves out loading and Prefect's start: the command says what that took,
    and it fits in the wall this test measured around the command."""
    stdout, _, summary = piped
    startup, flow = summary["startup_seconds"], summary["wall_seconds"]
    assert startup >= 0.5, "Python, torch and the flow run take more than half a second to start"
    assert startup + flow <= COMMAND_SECONDS["second.json"], (startup, flow, COMMAND_SECONDS)
    assert f"before the flow: {startup:.1f}s" in stdout
    logged = MlflowClient(tracking_uri).get_run(summary["parent_run_id"]).data.metrics
    assert logged["pipeline/startup_seconds"] == pytest.approx(startup)


def test_mlflow_shows_completions_and_gates_as_tables_on_the_evaluate_run(piped, tracking_uri):
    _, _, summary = piped
    client = MlflowClient(tracking_uri)
    evaluate = next(
        r for r in child_runs(tracking_uri, summary["parent_run_id"]) if r.info.run_name == "evaluate"
    )
    files = {a.path for a in client.list_artifacts(evaluate.info.run_id, "eval")}
    assert {COMPLETIONS_TABLE, GATES_TABLE} <= files
    logged = {
        t["path"] for t in json.loads(evaluate.data.tags["mlflow.loggedArtifacts"]) if t["type"] == "table"
    }
    assert {COMPLETIONS_TABLE, GATES_TABLE} <= logged, "listed as tables: the UI's evaluation view shows them"
    experiment, run_ids = evaluate.info.experiment_id, [evaluate.info.run_id]
    with tracking(tracking_uri):
        completions = client.load_table(experiment, COMPLETIONS_TABLE, run_ids)
        gates = client.load_table(experiment, GATES_TABLE, run_ids)
    assert {"prompt", "answer", "policy", "reference", "champion", "champion_correct"} <= set(
        completions.columns
    )
    verdicts = completions["champion_reward: policy vs champion"]
    assert set(verdicts) <= {"policy", "champion", "tie", ""} and len(completions) > 0
    # only the policy changed: the reward model is the cache hit of the first run, reused, not judged again
    assert set(gates["model"]) == {"watch-demo-policy"}
    assert summary["promotions"]["reward"]["reused"], summary["promotions"]
    assert {"value", "low", "high", "n", "needs", "outcome"} <= set(gates.columns)
    parent = client.get_run(summary["parent_run_id"])
    assert any(k.startswith("system/") for k in parent.data.metrics), "system metrics are on"
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "logs")], "the run's log file"
    curves = [a.path for a in client.list_artifacts(parent.info.run_id, "plots")]
    assert curves == ["plots/learning_curves.png"], curves
    trained = {s["name"]: s["run_id"] for s in summary["stages"] if s["name"] in ("sft", "reward", "policy")}
    drawn = {(stage, key) for stage, key, _, _ in learning_curves(tracking_uri, trained)}
    # SFT's 30 steps log a curve; the reward model's 10 steps log one point (at step 10), which
    # is not a curve, and the end-of-run mean TRL logs on that same step must not make it one
    assert ("sft", "train/loss") in drawn and {s for s, _ in drawn} == {"sft", "policy"}, drawn


def test_the_summary_of_a_stopped_run_says_why_and_gates_without_details_keep_their_description():
    from alignflow.flows.artifacts import gate_rows, outcome_line, summary_markdown

    stopped = {
        "project": "p",
        "stages": [{"name": "data", "seconds": 1.0, "compute_seconds": 0.0, "cached": False, "metrics": {}}],
        "stopped": {"reason": "label_disagreement", "message": "the champion reward model disagrees"},
        "wall_seconds": 2.0,
        "compute_seconds": 0.0,
        "orchestration_overhead": 1.0,
    }
    text = summary_markdown(stopped, [])
    assert "**Outcome:** stopped before training: the champion reward model disagrees" in text
    assert "| data | 1.0 | ran |" in text
    decision = {"name": "p-policy", "version": "3", "promoted": False, "judges": []}
    decision["failed"] = ["length_growth"]
    gate = {"name": "length_growth", "outcome": "failed", "describe": "length_growth: 2.6 [2.5, 2.8] n=16"}
    rejected = {**stopped, "stopped": None, "promotions": {"policy": {**decision, "gates": [gate]}}}
    rows = gate_rows(rejected)  # no tracking URI: the recorded details cannot be read
    assert rows[0]["needs"] == gate["describe"] and rows[0]["value"] is None
    assert outcome_line(rejected) == "p-policy v3 not promoted (failed: length_growth)"
    assert "| length_growth | failed |  |  |  | length_growth: 2.6 [2.5, 2.8] n=16 |" in summary_markdown(
        rejected, rows
    )


def test_the_console_the_prefect_summary_and_the_version_page_state_each_outcome_alike(
    on_terminal, piped, rejected, tracking_uri
):
    """Last in the module: its third run would be one more log file to the tests above.

    A promoted, a reused and a rejected model, each stated in the same words by the
    console, the Prefect summary (its outcome line and its section), and the MLflow version
    page of the decision (for a reused version: the page of the run that decided it)."""
    raw, first = on_terminal
    runs = [("\n".join(screen_lines(raw)), first), (piped[0], piped[2]), rejected]
    client, fates = MlflowClient(tracking_uri), set()
    for console, summary in runs:
        markdown = summary_artifact(summary)
        outcome = next(line for line in markdown.splitlines() if line.startswith("**Outcome:** "))
        for decision in summary["promotions"].values():
            said, model = outcome_statement(decision), f"{decision['name']} v{decision['version']}"
            assert f"{model}: {said}" in console, (said, console[-2000:])
            assert f"## {model}: {said}\n" in markdown and f"{model} {said}" in outcome, markdown
            page = client.get_model_version(decision["name"], str(decision["version"])).description
            if decision.get("reused"):  # decided, and described, by the run that produced it
                assert f"`{decision['produced_by_run']}`" in page, page
            else:
                assert page.startswith(f"**{said[0].upper()}{said[1:]}: "), (said, page[:300])
            fates.add(role_outcome(decision))
    assert fates == {"promoted", "reused", "rejected"}
    assert rejected[1]["promotions"]["policy"]["failed"], rejected[1]["promotions"]
    assert "promoted to champion" not in summary_artifact(piped[2]).split(f"{PROJECT}-reward v1 ")[1][:40]
