"""The parent flow starting a stage deployment on a real Prefect server and process worker.

``prefect server start`` keeps its state in a fresh PostgreSQL database; a process work
pool, a deployment of ``stage-sft`` from this checkout and a ``prefect worker`` are set up
the way a team would; ``retrain`` with ``orchestration.work_pools.sft`` set hands the SFT
stage to that worker through ``run_deployment``. Everything listens on 127.0.0.1 only and
every process started here is stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from alignflow.registry.server import free_port
from tests.integration.conftest import server_url
from tests.integration.test_mlflow_postgres import TINY_RUN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[2]
POOL = "alignflow-test-cpu"


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )


def _stop(process: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_healthy(api_url: str, process: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(1)
    pytest.fail(f"prefect server did not become healthy:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def prefect_server(postgres_url, fresh_database, tmp_path):
    database = fresh_database("alignflow_prefect")
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_API_URL": api_url,
        "PREFECT_API_DATABASE_CONNECTION_URL": server_url(postgres_url, database, "asyncpg"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / "results"),
        "DO_NOT_TRACK": "1",
    }
    port = api_url.rsplit(":", 1)[1].split("/")[0]
    log = tmp_path / "prefect-server.log"
    server = _start(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", port], env, log
    )
    try:
        _wait_healthy(api_url, server, log)
        yield env
    finally:
        _stop(server)


def test_parent_flow_runs_a_stage_deployment_on_a_process_worker(prefect_server, tmp_path, monkeypatch):
    env = prefect_server
    for key in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_RESULTS_LOCAL_STORAGE_PATH"):
        monkeypatch.setenv(key, env[key])
    from prefect.settings import PREFECT_API_URL, temporary_settings

    prefect = [sys.executable, "-m", "prefect"]
    create_pool = [*prefect, "work-pool", "create", POOL, "--type", "process"]
    subprocess.run(create_pool, env=env, check=True, timeout=120)

    deploy = (
        "from alignflow.flows.stages import sft_stage; "
        f"sft_stage.from_source({str(REPO)!r}, 'alignflow/flows/stages.py:sft_stage')"
        f".to_deployment(name='default', work_pool_name={POOL!r}).apply()"
    )
    subprocess.run([sys.executable, "-c", deploy], env=env, cwd=REPO, check=True, timeout=180)

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        before = _doctor({"sft": POOL, "reward": "no-such-pool"})
    idle, absent = before[f"Work pool {POOL}"], before["Work pool no-such-pool"]
    assert not idle.ok and "0 online" in idle.detail and "prefect worker start" in idle.fix
    assert not absent.ok and "does not exist" in absent.detail
    assert before["Deployment stage-sft/default"].ok
    assert "not deployed" in before["Deployment stage-reward/default"].detail

    worker_log = tmp_path / "worker.log"
    worker = _start([*prefect, "worker", "start", "--pool", POOL, "--type", "process"], env, worker_log)
    try:
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            from alignflow.flows.retrain import retrain

            overrides = [
                *TINY_RUN,
                f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                f"tracking.artifact_location={tmp_path / 'mlartifacts'}",
                f"orchestration.work_pools.sft={POOL}",
                "orchestration.stage_timeout_s=600",
            ]
            summary = retrain(None, overrides, repo_dir=str(tmp_path / "repo"))
            # asked under the same settings: outside them, a session-wide test harness that
            # another file started on this xdist worker would answer instead of this server
            stage_runs = _flow_runs_of("stage-sft")
            reward_runs = _flow_runs_of("stage-reward")
            after = _doctor({"sft": POOL})
    finally:
        _stop(worker)

    assert "sft" in {stage["name"] for stage in summary["stages"]}, summary
    assert len(stage_runs) == 1, worker_log.read_text(errors="replace")[-3000:]
    run = stage_runs[0]
    assert run.state.is_completed()
    assert run.work_pool_name == POOL
    assert run.infrastructure_pid and int(str(run.infrastructure_pid).rsplit(":", 1)[-1]) != os.getpid()
    # the stages without a pool ran in-process, as subflows of the parent
    assert len(reward_runs) == 1 and reward_runs[0].work_pool_name is None, reward_runs
    # with the worker polling, `alignflow doctor` finds nothing missing on the server
    assert all(check.ok for check in after.values()), after


def _doctor(pools: dict[str, str]) -> dict:
    from alignflow.cli.doctor import check_work_pools

    return {check.name: check for check in check_work_pools(pools, "default")}


def _flow_runs_of(flow_name: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    flows = FlowFilter(name=FlowFilterName(any_=[flow_name]))
    with get_client(sync_client=True) as client:  # explicit sort and limit: the server rejects nulls
        return client.read_flow_runs(flow_filter=flows, sort=FlowRunSort.START_TIME_ASC, limit=20)
