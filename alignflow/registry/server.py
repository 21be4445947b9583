"""Start a real ``mlflow server`` on loopback for a while (tests, local demos).

The same code path as a team's tracking server: REST API, proxied artifact store,
sqlite (or any SQLAlchemy URI) backend. Used by the integration tests as a fixture and
by anyone who wants the UI over a pipeline's ``mlflow.db`` without typing the flags.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalServer:
    url: str
    backend_store_uri: str
    artifacts_destination: Path
    pid: int


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _healthy(health_url: str) -> bool:
    try:
        with urllib.request.urlopen(health_url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_healthy(
    health_url: str, process: subprocess.Popen, log_tail: Callable[[], str], timeout: float, what: str
) -> None:
    """Return once ``health_url`` answers 200; raise with the server's log tail if ``process``
    exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not _healthy(health_url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} at {health_url} did not become healthy:\n{log_tail()}")
        time.sleep(0.5)


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the process group ``process`` leads: a server forks its web
    workers, and they go with it."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def local_mlflow_server(
    workdir: str | Path,
    backend_store_uri: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 120.0,
) -> Iterator[LocalServer]:
    """Run ``mlflow server`` as a subprocess until the block ends; yields its URL.

    The backend defaults to ``sqlite:///<workdir>/mlflow.db`` and artifacts are served by
    the server from ``<workdir>/artifacts`` (clients upload through the REST API).
    Output goes to ``<workdir>/server.log``, quoted in the error if the server never
    becomes healthy.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    backend = backend_store_uri or f"sqlite:///{workdir / 'mlflow.db'}"
    artifacts = workdir / "artifacts"
    artifacts.mkdir(exist_ok=True)
    port = port or free_port(host)
    url = f"http://{host}:{port}"
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", backend,
        "--artifacts-destination", str(artifacts),
        "--serve-artifacts",
        "--host", host,
        "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    log_path = workdir / "server.log"
    env = {**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
        )
    try:

        def tail() -> str:
            return log_path.read_text(errors="replace")[-3000:]

        wait_until_healthy(f"{url}/health", process, tail, startup_timeout, "mlflow server")
        yield LocalServer(url, backend, artifacts, process.pid)
    finally:
        stop_process_group(process)
