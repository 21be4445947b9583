"""``alignflow serve``'s Prefect runner, stopped within seconds by Ctrl-C or SIGTERM.

``prefect.serve`` starts Prefect's ephemeral API server as a child in the caller's process
group. Ctrl-C in a terminal signals that whole group, so the server died first, and the
runner's shutdown (pausing each deployment's schedule, its observers' last polls) then
retried a dead API with back-off for over a minute, printing tracebacks. Here that server
runs in a process group of its own: only the runner sees the signal, shuts down against a
live API, and the server is stopped after it. SIGTERM takes the Ctrl-C path (Prefect's own
SIGTERM handler leaves its stop coroutine un-awaited and exits from inside the event loop).

Imported by the ``serve`` command only: it imports Prefect.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from functools import partial
from typing import Any
from unittest import mock
from uuid import UUID

from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterEndTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.runner import Runner
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, temporary_settings

from alignflow.cli.shutdown import Terminated
from alignflow.flows.killed_runs import mark_killed_runs_crashed

_POPEN = subprocess.Popen
REPORT_EVERY_S = 5.0  # how soon after a scheduled run ends its line is printed


class _OwnGroupServer(SubprocessASGIServer):
    """Prefect's ephemeral API server in a process group of its own: out of reach of the
    terminal's Ctrl-C, which would otherwise stop it before the runner is done with it."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        with mock.patch.object(subprocess, "Popen", partial(_POPEN, process_group=0)):
            return super()._run_uvicorn_command()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _environment_variable(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextmanager
def api_outliving_the_runner() -> Iterator[None]:
    """Prefect's API for the runner, kept up until the runner has shut down.

    A configured server (``PREFECT_API_URL``) is used as it is; otherwise an ephemeral one
    is started here and stopped on the way out. Its URL goes into this thread's settings
    and the environment (Prefect's own threads and the flow runs' processes read that).
    """
    if PREFECT_API_URL.value():
        yield
        return
    server = _OwnGroupServer(port=_free_port())
    server.start()
    try:
        with (
            _environment_variable("PREFECT_API_URL", server.api_url),
            temporary_settings(updates={PREFECT_API_URL: server.api_url}),
        ):
            yield
    finally:
        server.stop()


def outcome_line(flow_run: FlowRun, deployment: str) -> str:
    """A finished flow run in one line: when, which, its state, and what came of it (its
    ``outcome:`` and ``<role>:`` tags, set by the retrain flow) or the state's message."""
    from alignflow.flows.run_log import ROLE_FATES

    tags = dict(t.split(":", 1) for t in flow_run.tags if ":" in t)
    state = flow_run.state
    said = [tags["outcome"]] if "outcome" in tags else []
    fates = [f"{role} {fate}" for role, fate in sorted(tags.items()) if fate in ROLE_FATES]
    if fates:
        said.append(f"({', '.join(fates)})")
    if not said and state is not None and state.message and not state.is_completed():
        said.append(state.message.splitlines()[0][:200])
    ended = flow_run.end_time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if flow_run.end_time else "-"
    head = f"[{ended}] {deployment} run {flow_run.name!r}: {state.name if state else 'unknown'}"
    return f"{head}: {' '.join(said)}" if said else head


FINISHED = [StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED]


async def report_finished(
    client: Any, deployments: dict[UUID, str], since: datetime, seen: set[UUID], report: Callable[[str], None]
) -> None:
    """One line through ``report`` for each run of ``deployments`` that ended after ``since``
    and is not in ``seen`` yet."""
    runs = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            deployment_id=FlowRunFilterDeploymentId(any_=list(deployments)),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=FINISHED)),
            end_time=FlowRunFilterEndTime(after_=since),
        ),
        sort=FlowRunSort.END_TIME_DESC,
        limit=50,
    )
    for flow_run in reversed(runs):
        if flow_run.id not in seen:
            seen.add(flow_run.id)
            report(outcome_line(flow_run, deployments.get(flow_run.deployment_id, "?")))


class _StoppableRunner(Runner):
    """A runner that SIGTERM stops the way Ctrl-C does: by cancelling the task serving it;
    it reports each finished run of its deployments (Prefect's runner says nothing at the
    CLI's WARNING log level)."""

    terminated = False
    _serving: asyncio.Task | None = None

    async def serve(self, deployments: Sequence[Any], announce, report: Callable[[str], None]) -> None:
        self._serving = asyncio.current_task()
        if self.terminated:  # SIGTERM came while the loop was starting: nothing to cancel yet
            return
        served = {}
        for deployment in deployments:
            served[await self.aadd_deployment(deployment)] = f"{deployment.flow_name}/{deployment.name}"
        await asyncio.to_thread(mark_killed_runs_crashed)  # a killed worker's runs (it logs each)
        announce()
        watcher = asyncio.create_task(self._watch(served, report))
        try:
            await self.start()
        finally:
            watcher.cancel()

    async def _watch(self, deployments: dict[UUID, str], report: Callable[[str], None]) -> None:
        """Report finished runs every few seconds for as long as the runner serves."""
        from prefect import get_client

        since, seen = datetime.now(UTC), set[UUID]()
        async with get_client() as client:
            while True:
                await asyncio.sleep(REPORT_EVERY_S)
                try:
                    await report_finished(client, deployments, since, seen, report)
                except Exception as error:  # a missed line must not stop the schedule
                    self._logger.debug("could not read finished flow runs: %s", error)

    def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
        self.terminated = True
        if self._serving is not None:
            self._serving.cancel()
            self._serving.get_loop().call_soon_threadsafe(lambda: None)  # wake a sleeping loop


@contextmanager
def runner_owns_sigterm(runner: _StoppableRunner) -> Iterator[None]:
    """SIGTERM goes to the runner from before its loop starts, not only once Prefect's
    ``start`` installs its handler: announcing the schedule comes first, and a SIGTERM in
    between would meet the caller's handler, whose exception can land in a frame that drops
    it (a weakref callback) and leave the schedule served until killed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, runner.handle_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve_until_stopped(deployments: Sequence[Any], announce, report: Callable[[str], None]) -> None:
    """Serve ``deployments`` until Ctrl-C (returns) or SIGTERM (raises ``Terminated``).

    ``announce`` is called once every deployment is registered with the API, ``report``
    with one line for each run of them that finishes.
    """
    runner = _StoppableRunner(pause_on_shutdown=True)
    # Ctrl-C, or SIGTERM (below); the API is stopped only once the runner is done with it
    with (
        runner_owns_sigterm(runner),
        api_outliving_the_runner(),
        suppress(KeyboardInterrupt, asyncio.CancelledError),
    ):
        asyncio.run(runner.serve(deployments, announce, report))
    if runner.terminated:
        raise Terminated(128 + signal.SIGTERM)
