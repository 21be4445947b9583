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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any
from unittest import mock

from prefect.runner import Runner
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, temporary_settings

from alignflow.cli.shutdown import Terminated

_POPEN = subprocess.Popen


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


class _StoppableRunner(Runner):
    """A runner that SIGTERM stops the way Ctrl-C does: by cancelling the task serving it."""

    terminated = False
    _serving: asyncio.Task | None = None

    async def serve(self, deployments: Sequence[Any], announce) -> None:
        self._serving = asyncio.current_task()
        for deployment in deployments:
            await self.aadd_deployment(deployment)
        announce()
        await self.start()

    def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
        self.terminated = True
        if self._serving is not None:
            self._serving.cancel()
            self._serving.get_loop().call_soon_threadsafe(lambda: None)  # wake a sleeping loop


def serve_until_stopped(deployments: Sequence[Any], announce) -> None:
    """Serve ``deployments`` until Ctrl-C (returns) or SIGTERM (raises ``Terminated``).

    ``announce`` is called once every deployment is registered with the API.
    """
    runner = _StoppableRunner(pause_on_shutdown=True)
    # Ctrl-C, or SIGTERM (below); the API is stopped only once the runner is done with it
    with api_outliving_the_runner(), suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(runner.serve(deployments, announce))
    if runner.terminated:
        raise Terminated(128 + signal.SIGTERM)
