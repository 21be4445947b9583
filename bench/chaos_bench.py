"""Kill the demo flow at seeded random moments, rerun it, and check that nothing was lost or doubled.

One uninterrupted run of ``alignflow run`` (the embedded demo) in a workspace of its own gives
the reference: its champion's weights, its wall time and how long each stage took. Then, in a
fresh workspace each, the same command is SIGKILLed (its whole process group, Prefect's API
included) once, and run again as a user would, plainly:

* in a training or evaluation stage, a seeded random share of that stage's reference time after
  the run's log says it started;
* at each of the registry's kill points (:mod:`alignflow.kill_points`): the moments between two
  registry writes that a random time almost never hits;
* a Prefect worker: ``alignflow serve`` on a Prefect server, SIGKILLed with the flow run it was
  training; the new worker must mark that run crashed, and the deployment's next run finish it.

After each rerun the checks read the workspace's MLflow store: the champion's weights (sha256
of its registered safetensors) equal the reference's, one registry version per trained model,
each version decided and ``champion`` only on a promoted one, one MLflow run per stage (the
killed one continued, none left RUNNING) under one parent run, and every input row accounted for
(kept or quarantined). Writes ``bench/results/chaos.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 0
TIMED_STAGES = ("data", "sft", "reward", "policy", "evaluate")
TIMEOUT_S = 1800
_LOG_LINE = re.compile(r"^(\S+ \S+) INFO alignflow\.flows\.retrain: (\w+): (started|done in ([0-9.]+)s)")


@dataclass
class Rerun:
    """One kill and the plain rerun after it, with what the checks found."""

    moment: str  # what was aimed at: "sft, 0.42 of its time" or "kill point register.versioned"
    killed_in: str  # the stage the run's log had open when the kill landed
    rerun_s: float
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


# ---------------------------------------------------------------- running the CLI


def environment(workspace: Path, kill_at: str | None = None) -> dict[str, str]:
    """A user's shell in ``workspace``: no tracking URI or Prefect API from around it."""
    from alignflow.flows.environment import workspace_environment
    from alignflow.kill_points import KILL_AT_ENV

    env = workspace_environment(drop=("PYTEST_", KILL_AT_ENV)) | {"HF_HUB_OFFLINE": "1"}
    return env | ({KILL_AT_ENV: kill_at} if kill_at else {})


def start(workspace: Path, overrides: list[str], kill_at: str | None = None) -> subprocess.Popen:
    """``alignflow run`` in ``workspace``, the leader of its own process group."""
    workspace.mkdir(parents=True, exist_ok=True)
    sets = [arg for item in overrides for arg in ("--set", item)]
    log = (workspace / "cli.log").open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "alignflow.cli", "run", "--quiet", *sets, "--summary-json", "summary.json"],
        cwd=workspace,
        env=environment(workspace, kill_at),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run and everything it started (the ephemeral Prefect API too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_to_end(workspace: Path, overrides: list[str]) -> tuple[float, dict[str, Any]]:
    """The plain command, to its end: its wall time and its summary."""
    started = time.perf_counter()
    proc = start(workspace, overrides)
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        kill_group(proc)  # a leftover child (an API server) must not outlive the run
    if code != 0:
        tail = (workspace / "cli.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"alignflow run in {workspace} exited {code}:\n{tail}")
    return time.perf_counter() - started, json.loads((workspace / "summary.json").read_text())


def stage_events(workspace: Path) -> list[tuple[str, str, float | None]]:
    """``(stage, "started" | "done", seconds)`` in the order the run logs wrote them."""
    events = []
    for path in sorted((workspace / ".alignflow" / "logs").glob("run-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = _LOG_LINE.match(line)
            if match:
                _, stage, what, seconds = match.groups()
                events.append((stage, what.split()[0], float(seconds) if seconds else None))
    return events


def open_stage(workspace: Path) -> str:
    """The stage the log says was running last (started, not done), or ``between stages``."""
    running: list[str] = []
    for stage, what, _ in stage_events(workspace):
        if what == "started":
            running.append(stage)
        elif stage in running:
            running.remove(stage)
    return running[-1] if running else "between stages"


def stage_seconds(workspace: Path) -> dict[str, float]:
    return {stage: seconds for stage, what, seconds in stage_events(workspace) if seconds is not None}


def kill_when(workspace: Path, overrides: list[str], ready: Callable[[], bool], after_s: float = 0.0) -> str:
    """Start the run, wait until ``ready()``, SIGKILL it ``after_s`` later; the stage it was in
    then (the run may have moved on or ended: the checks hold whichever)."""
    proc = start(workspace, overrides)
    deadline = time.monotonic() + TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline and not ready():
        time.sleep(0.05)
    time.sleep(after_s)
    finished = proc.poll() is not None
    kill_group(proc)
    return "after the end" if finished else open_stage(workspace)


def kill_in_stage(workspace: Path, overrides: list[str], stage: str, after_s: float) -> str:
    """SIGKILL the run ``after_s`` after its log says ``stage`` started."""

    def started() -> bool:
        return any(s == stage and what == "started" for s, what, _ in stage_events(workspace))

    return kill_when(workspace, overrides, started, after_s)


def kill_at_point(workspace: Path, overrides: list[str], point: str) -> str:
    """Run with ``ALIGNFLOW_KILL_AT=point``: the run kills itself there."""
    proc = start(workspace, overrides, kill_at=point)
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        kill_group(proc)
    if code != -signal.SIGKILL:
        raise RuntimeError(f"the run never reached kill point {point} (exit {code})")
    return open_stage(workspace)


# ---------------------------------------------------------------- a Prefect worker killed

WORKER_DEPLOYMENT = "chaos"
NEVER = "0 0 1 1 *"  # the worker's cron: the runs here are started by hand


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[str]:
    """A Prefect server of its own (SQLite in ``home``), up until the block ends: the API that
    outlives the worker killed under it, as a compose stack's server does. Yields its URL."""
    import httpx

    port, home = _free_port(), home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = environment(home) | {"PREFECT_HOME": str(home)}
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with (home / "server.log").open("a") as log:
        server = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/api"
    try:
        _wait(lambda: _answers(httpx, f"{url}/health"), server, "the Prefect server", home / "server.log")
        yield url
    finally:
        kill_group(server)


def _answers(httpx: Any, url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(
    ready: Callable[[], bool], proc: subprocess.Popen, what: str, log: Path, timeout: float = 300
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{what} never became ready (exit {proc.poll()}):\n{tail}")
        time.sleep(0.2)


def start_worker(workspace: Path, overrides: list[str], api_url: str) -> subprocess.Popen:
    """``alignflow serve`` in ``workspace`` on the server at ``api_url``, ready to take runs: a
    local process worker (each flow run in a child process of it), leader of its own group."""
    from alignflow.config import DEFAULT_CONFIG

    workspace.mkdir(parents=True, exist_ok=True)
    sets = [arg for item in overrides for arg in ("--set", item)]
    log_path = workspace / "worker.log"
    marker = log_path.stat().st_size if log_path.exists() else 0
    env = environment(workspace) | {"PREFECT_API_URL": api_url, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    command = [sys.executable, "-m", "alignflow.cli", "serve", "--config", str(DEFAULT_CONFIG), *sets]
    command += ["--name", WORKER_DEPLOYMENT, "--cron", NEVER]
    with log_path.open("a") as log:
        worker = subprocess.Popen(
            command, cwd=workspace, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def serving() -> bool:
        return "polling for scheduled runs" in log_path.read_text(errors="replace")[marker:]

    _wait(serving, worker, "alignflow serve", log_path)
    return worker


def _client(api_url: str) -> Any:
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    @contextlib.contextmanager
    def client() -> Iterator[Any]:
        with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as c:
            yield c

    return client()


def start_deployment_run(api_url: str) -> str:
    """What ``prefect deployment run retrain/chaos`` does: a flow run for the worker to take."""
    with _client(api_url) as client:
        deployment = client.read_deployment_by_name(f"retrain/{WORKER_DEPLOYMENT}")
        return str(client.create_flow_run_from_deployment(deployment.id).id)


def flow_run_state(api_url: str, flow_run_id: str) -> tuple[str, str]:
    """The flow run's state type and message, as the Prefect UI shows them."""
    with _client(api_url) as client:
        state = client.read_flow_run(flow_run_id).state
    return (state.type.value, state.message or "") if state else ("NONE", "")


def wait_for_flow_run(api_url: str, flow_run_id: str, worker: subprocess.Popen, log: Path) -> str:
    """The flow run's final state type, once it has one."""
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    _wait(lambda: flow_run_state(api_url, flow_run_id)[0] in final, worker, "the flow run", log, TIMEOUT_S)
    return flow_run_state(api_url, flow_run_id)[0]


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL a worker and every process under it (its flow runs' processes, whatever group
    they are in): the machine's view of a preempted worker. How many processes were killed."""
    import psutil

    try:
        victims = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        victims = []
    for victim in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    kill_group(proc)
    return len(victims)


def stop_worker(worker: subprocess.Popen) -> None:
    """SIGTERM, as a service manager stops it; SIGKILL whatever is left after a minute."""
    with contextlib.suppress(ProcessLookupError):
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    finally:
        kill_tree(worker)


def parent_summary(uri: str) -> dict[str, Any]:
    """The newest parent run, as the summary of ``alignflow run`` names it (no summary file comes
    from a worker's run)."""
    from alignflow.registry.runs import PARENT_RUN_TAG

    parents = sorted(
        (r for r in all_runs(uri) if PARENT_RUN_TAG not in r.data.tags), key=lambda r: r.info.start_time
    )
    return {"parent_run_id": parents[-1].info.run_id}


@dataclass
class WorkerKill:
    """A worker SIGKILLed while its flow run trained, restarted, and the flow run again."""

    killed_state: str  # the killed flow run's state when the new worker came up
    crashed_state: str  # ... once it had
    crashed_message: str
    worker_lines: list[str]  # what the new worker printed about it
    rerun_state: str
    rerun_s: float
    processes_killed: int


def kill_worker_and_rerun(
    workspace: Path, overrides: list[str], api_url: str, ready: Callable[[], bool]
) -> WorkerKill:
    """Serve the flow, start a run, SIGKILL the worker with its run once ``ready()``; then a
    new worker on the same API, and a new run of the deployment to its end."""
    worker = start_worker(workspace, overrides, api_url)
    log = workspace / "worker.log"
    try:
        killed_run = start_deployment_run(api_url)
        _wait(ready, worker, "the moment to kill the worker", log, TIMEOUT_S)
        killed_state = flow_run_state(api_url, killed_run)[0]
    finally:
        processes = kill_tree(worker)
    marker = log.stat().st_size
    worker = start_worker(workspace, overrides, api_url)
    try:
        crashed_state, message = flow_run_state(api_url, killed_run)
        said = [line for line in log.read_text(errors="replace")[marker:].splitlines() if "crashed" in line]
        started = time.perf_counter()
        rerun = start_deployment_run(api_url)
        rerun_state = wait_for_flow_run(api_url, rerun, worker, log)
        rerun_s = time.perf_counter() - started
    finally:
        stop_worker(worker)
    return WorkerKill(killed_state, crashed_state, message, said, rerun_state, rerun_s, processes)


# ---------------------------------------------------------------- what the store says


def tracking_uri(workspace: Path) -> str:
    return f"sqlite:///{workspace / 'mlflow.db'}"


def champion_weights(uri: str, name: str) -> str | None:
    """sha256 over the safetensors files the registry holds for ``name@champion``."""
    from alignflow.registry.models import CHAMPION, alias_version
    from alignflow.registry.replay import registered_weights_sha256

    version = alias_version(uri, name, CHAMPION)
    return None if version is None else registered_weights_sha256(uri, name, version)


def registry_checks(uri: str) -> tuple[dict[str, bool], list[str]]:
    """One version per registered model, each with its decision, champion only on a promoted one."""
    from mlflow import MlflowClient

    from alignflow.registry.decision_tags import DECISION_TAG
    from alignflow.registry.models import CHAMPION, alias_version

    client = MlflowClient(uri)
    notes, one, decided, alias_ok = [], True, True, True
    for model in client.search_registered_models():
        versions = client.search_model_versions(f"name = '{model.name}'")
        one &= len(versions) == 1
        undecided = [v.version for v in versions if DECISION_TAG not in (v.tags or {})]
        decided &= not undecided
        champion = alias_version(uri, model.name, CHAMPION)
        outcome = next((v.tags.get(DECISION_TAG) for v in versions if str(v.version) == champion), None)
        alias_ok &= champion is None or outcome == "promoted"
        notes.append(
            f"{model.name}: {len(versions)} version(s), champion {champion or '-'}"
            + (f", undecided {undecided}" if undecided else "")
        )
    return {
        "one version per model": one,
        "every version decided": decided,
        "champion only if promoted": alias_ok,
    }, notes


def all_runs(uri: str) -> list[Any]:
    """Every run of every experiment in the store."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)


def stage_runs(uri: str) -> list[Any]:
    from alignflow.registry.runs import PARENT_RUN_TAG

    return [r for r in all_runs(uri) if PARENT_RUN_TAG in r.data.tags]


def run_checks(uri: str) -> tuple[dict[str, bool], list[str]]:
    """One parent run, one run per stage under it, none left RUNNING."""
    from alignflow.registry.runs import PARENT_RUN_TAG, STAGE_TAG

    runs = all_runs(uri)
    parents = [r for r in runs if PARENT_RUN_TAG not in r.data.tags]
    stages: dict[str, int] = {}
    for r in runs:
        if PARENT_RUN_TAG in r.data.tags:
            name = r.data.tags.get(STAGE_TAG, r.info.run_name)
            stages[name] = stages.get(name, 0) + 1
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    doubled = {s: n for s, n in stages.items() if n > 1}
    notes = [f"{len(parents)} parent run(s), stage runs {dict(sorted(stages.items()))}"]
    notes += [f"left RUNNING: {running}"] if running else []
    checks = {
        "one parent run": len(parents) == 1,
        "one run per stage": not doubled,
        "no run left RUNNING": not running,
    }
    return checks, notes


def data_manifest(uri: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The data manifest the parent run logged (``data/manifest.json``): read from the store."""
    import mlflow

    path = mlflow.artifacts.download_artifacts(
        run_id=summary["parent_run_id"], artifact_path="data/manifest.json", tracking_uri=uri
    )
    return json.loads(Path(path).read_text())


def rows_accounted(manifest: dict[str, Any], input_rows: int) -> bool:
    """The manifest's counts add up to its input rows, as many as the reference read."""
    return bool(manifest["counts_add_up"]) and manifest["input_rows"] == input_rows


def check(
    workspace: Path, summary: dict[str, Any], reference: dict[str, Any]
) -> tuple[dict[str, bool], list[str]]:
    uri = tracking_uri(workspace)
    checks = {
        role: champion_weights(uri, name) == reference["weights"][role]
        for role, name in reference["names"].items()
    }
    checks = {f"{role} champion weights as uninterrupted": ok for role, ok in checks.items()}
    registry, notes = registry_checks(uri)
    runs, run_notes = run_checks(uri)
    rows = {
        "every input row accounted for": rows_accounted(data_manifest(uri, summary), reference["input_rows"])
    }
    return {**checks, **registry, **runs, **rows}, notes + run_notes


# ---------------------------------------------------------------- the plan and the report


def moments(seed: int = SEED, stages: tuple[str, ...] = TIMED_STAGES) -> list[tuple[str, Any]]:
    """The kills, seeded: ``("stage", (name, share of its time))`` per timed stage, then every
    registry kill point as ``("point", name)``."""
    from alignflow.kill_points import POINTS

    rng = random.Random(seed)
    timed: list[tuple[str, Any]] = [("stage", (stage, round(rng.uniform(0.05, 0.95), 2))) for stage in stages]
    return timed + [("point", name) for name in POINTS]


def reference_run(root: Path, overrides: list[str]) -> dict[str, Any]:
    from alignflow.registry.models import registered_name

    workspace = root / "uninterrupted"
    wall, summary = run_to_end(workspace, overrides)
    uri = tracking_uri(workspace)
    project = summary["project"]
    names = {role: registered_name(project, role) for role in ("policy", "reward")}
    weights = {role: champion_weights(uri, name) for role, name in names.items()}
    return {
        "wall_s": wall,
        "stage_s": stage_seconds(workspace),
        "names": {role: name for role, name in names.items() if weights[role]},
        "weights": weights,
        "input_rows": int(data_manifest(uri, summary)["input_rows"]),
        "summary": summary,
        "workspace": workspace,
    }


def kill_and_rerun(
    root: Path, overrides: list[str], index: int, kind: str, what: Any, reference: dict
) -> Rerun:
    workspace = root / f"kill-{index:02d}"
    if kind == "stage":
        stage, share = what
        after = share * reference["stage_s"].get(stage, 0.0)
        killed_in = kill_in_stage(workspace, overrides, stage, after)
        moment = f"{stage}, {share:.2f} of its time ({after:.1f} s in)"
    else:
        killed_in = kill_at_point(workspace, overrides, what)
        moment = f"kill point `{what}`"
    rerun_s, summary = run_to_end(workspace, overrides)
    checks, notes = check(workspace, summary, reference)
    return Rerun(moment, killed_in, rerun_s, checks, notes)


def worker_kill(root: Path, overrides: list[str], index: int, reference: dict) -> Rerun:
    """The flow served by ``alignflow serve`` on a Prefect server, the worker SIGKILLed with its
    flow run once the policy stage saved a checkpoint; a new worker, and the deployment run again."""
    workspace = root / f"kill-{index:02d}"

    def policy_checkpointed() -> bool:
        return any(workspace.glob("outputs/*/policy-*/checkpoints/checkpoint-*"))

    with prefect_server(workspace / "prefect-server") as api:
        outcome = kill_worker_and_rerun(workspace, overrides, api, policy_checkpointed)
    from alignflow.registry.runs import STAGE_TAG

    uri = tracking_uri(workspace)
    checks, notes = check(workspace, parent_summary(uri), reference)
    policy = [r for r in stage_runs(uri) if r.data.tags.get(STAGE_TAG) == "policy"]
    resumed = [value for r in policy for key, value in r.data.tags.items() if key.endswith(".resumed_from")]
    checks |= {
        "killed flow run marked crashed": outcome.crashed_state == "CRASHED",
        "next flow run completed": outcome.rerun_state == "COMPLETED",
    }
    notes += [
        f"killed flow run: {outcome.killed_state} -> {outcome.crashed_state} ({outcome.crashed_message})"
    ]
    notes += [f"policy resumed from {', '.join(resumed) or 'nothing'}"]
    moment = f"Prefect worker (`alignflow serve`) and its flow run, {outcome.processes_killed} processes"
    return Rerun(moment, "policy", outcome.rerun_s, checks, notes)


def run_chaos(root: Path, overrides: list[str], seed: int = SEED) -> tuple[dict[str, Any], list[Rerun]]:
    reference = reference_run(root, overrides)
    plan = moments(seed)
    reruns = [
        kill_and_rerun(root, overrides, i, kind, what, reference)
        for i, (kind, what) in enumerate(plan, start=1)
    ]
    reruns.append(worker_kill(root, overrides, len(plan) + 1, reference))
    return reference, reruns


def to_markdown(reference: dict[str, Any], reruns: list[Rerun], machine: str, seed: int) -> str:
    passed = sum(r.passed for r in reruns)
    check_names = list(dict.fromkeys(name for r in reruns for name in r.checks))
    lines = [
        "# Kill anything: the demo flow SIGKILLed and rerun",
        "",
        "Generated by `python -m bench chaos` (`bench/chaos_bench.py`): the embedded demo (`alignflow run`),",
        "once uninterrupted, then in a fresh workspace per kill, SIGKILLed (the whole process group) at a",
        f"seeded moment (seed {seed}) and run again with the same plain command. Every figure is read from",
        "the workspace's MLflow store after the rerun. The last row is a Prefect worker instead: the demo",
        "served by `alignflow serve` on a Prefect server of its own, the worker and its flow run's process",
        "SIGKILLed once the policy stage saved a checkpoint, then a new worker and the deployment run again;",
        "its wall is that run's (`-`: a check that row has not).",
        "",
        f"Machine: {machine}.",
        "",
        f"**{passed} of {len(reruns)} kills: every check held after the rerun.** Uninterrupted run:"
        f" {reference['wall_s']:.1f} s wall (stages: "
        + ", ".join(f"{s} {v:.1f} s" for s, v in reference["stage_s"].items())
        + ").",
        "",
        "| # | aimed at | killed in | rerun wall | rerun / uninterrupted | "
        + " | ".join(check_names)
        + " | what the store holds |",
        "|---|---|---|---|---|" + "---|" * len(check_names) + "---|",
    ]
    for i, r in enumerate(reruns, start=1):
        marks = " | ".join(_mark(r.checks.get(c)) for c in check_names)
        ratio, notes = r.rerun_s / reference["wall_s"], "; ".join(r.notes)
        wall = f"{r.rerun_s:.1f} s | {ratio:.2f}"
        lines.append(f"| {i} | {r.moment} | {r.killed_in} | {wall} | {marks} | {notes} |")
    return "\n".join(lines) + "\n"


def _mark(held: bool | None) -> str:
    return "-" if held is None else "yes" if held else "**NO**"


def run() -> dict[str, Any]:
    from bench.training_bench import machine

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # as the CLI's defaults
    kept = os.environ.get("ALIGNFLOW_BENCH_KEEP")
    root = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="alignflow-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        reference, reruns = run_chaos(root, [])
    finally:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)
    where = machine()
    (Path(__file__).parent / "results" / "chaos.md").write_text(
        to_markdown(reference, reruns, where, SEED), encoding="utf-8"
    )
    return {
        "kills": len(reruns),
        "kills_all_checks_held": sum(r.passed for r in reruns),
        "uninterrupted_wall_s": round(reference["wall_s"], 1),
        "rerun_wall_s_max": round(max(r.rerun_s for r in reruns), 1),
        "machine": where,
    }
