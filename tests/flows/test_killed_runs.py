"""Runs left Running by a killed process are marked Crashed; runs of a live process, of another
host or of no known process are left alone (read back through the session's Prefect API)."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
from prefect import flow, get_client, task
from prefect.client.schemas.objects import StateType
from prefect.states import Completed, Running

from alignflow.flows.killed_runs import OWNER_LABEL, killed, mark_killed_runs_crashed, owner_label, run_owner


@flow(name="killed-runs-probe")
def probe() -> None:
    """Never run: the flow runs below are made through the API, as a killed process left them."""


@task(name="killed-runs-probe-task")
def probe_task() -> None:
    """Never run, as ``probe``."""


@pytest.fixture
def dead_owner() -> str:
    """The owner label of a process of this host that has since exited."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(child.pid).create_time()
    finally:
        child.kill()
        child.wait()
    return f"{OWNER_LABEL}{owner_label()[len(OWNER_LABEL) :].rsplit(':', 2)[0]}:{child.pid}:{started:.3f}"


def _running_flow_run(client, tags: list[str]):
    return client.create_flow_run(probe, tags=["killed-runs-test", *tags], state=Running())


def test_only_a_dead_process_s_runs_are_marked_crashed(dead_owner):
    with get_client(sync_client=True) as client:
        dead = _running_flow_run(client, [dead_owner])
        dead_task = client.create_task_run(probe_task, dead.id, "0", extra_tags=[dead_owner], state=Running())
        alive = _running_flow_run(client, [owner_label()])  # this very process
        elsewhere = _running_flow_run(client, [f"{OWNER_LABEL}another-host:1:1.000"])
        unowned = _running_flow_run(client, [])
        try:
            lines = mark_killed_runs_crashed()
            state = client.read_flow_run(dead.id).state
            assert state.type == StateType.CRASHED
            pid = dead_owner.rsplit(":", 2)[1]
            assert f"pid {pid}" in state.message and "killed" in state.message
            assert client.read_task_run(dead_task.id).state.type == StateType.CRASHED
            assert [line for line in lines if str(dead.id) in line], lines
            for kept in (alive, elsewhere, unowned):
                assert client.read_flow_run(kept.id).state.type == StateType.RUNNING, kept.tags
            assert mark_killed_runs_crashed() == [], "a run once marked is not marked again"
        finally:
            for run in (alive, elsewhere, unowned):
                client.set_flow_run_state(run.id, Completed(), force=True)


def test_a_reused_pid_does_not_pass_for_the_killed_process():
    """The owner's pid alive again in a newer process (this one, started later) is still gone."""
    host_pid = owner_label()[len(OWNER_LABEL) :].rsplit(":", 1)[0]
    assert killed([f"{OWNER_LABEL}{host_pid}:1.000"])
    assert not killed([owner_label()])
    assert run_owner(["project:demo", owner_label()]) == owner_label()[len(OWNER_LABEL) :]
    assert not killed(["project:demo"])
