"""SIGTERM stops a long-running command and every process it started.

Each command is the real one, started as its own process in a scratch directory. It is
stopped once Prefect's ephemeral API server (a uvicorn subprocess) answers: that child is
the one that was left running, holding its port, after ``alignflow api`` or ``alignflow
run`` ended on SIGTERM (``alignflow serve``, whose Prefect runner handles SIGTERM itself,
is held to the same).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 150

# the API's jobs start Prefect's ephemeral server on their first flow run; this launcher
# runs one flow at start-up, through the same Prefect code, so that no job has to train
LAUNCHER = """
from prefect import flow


@flow
def warm_up():
    return "ok"


def make_launcher(settings):
    warm_up()
    from alignflow.flows.feedback_launcher import make_launcher as retrain_launcher

    return retrain_launcher(settings)
"""

# a process under stopping_children() whose child ignores SIGTERM and has a child of its own;
# it prints their pids, then signals itself
STOPPED_SCRIPT = """
import os, signal, subprocess, sys, time
from alignflow.cli.shutdown import stopping_children

CHILD = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(grandchild.pid, flush=True); time.sleep(60)"
)
with stopping_children(grace=1):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    print(child.pid, child.stdout.readline().strip(), flush=True)
    os.kill(os.getpid(), int(sys.argv[1]))
    time.sleep(30)
"""


def _default_signals() -> None:
    """Start the command with SIGINT and SIGTERM at their defaults, as a terminal's foreground job.

    A child inherits ignored signals: under a shell script's background job (``make test &``,
    ``nohup``) pytest and so the command start with SIGINT ignored, Python then installs no
    KeyboardInterrupt handler, and the signal the test sends would be dropped by design.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the name field may hold spaces
        children.setdefault(parent, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list[int]:
    children, found, pending = _children_by_parent(), [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to collect it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(condition: Callable[[], object], process: subprocess.Popen, what: str, log: Path) -> object:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process.poll() is not None:
            pytest.fail(f"the command exited ({process.returncode}) before {what}\n{_state(process, log)}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {STARTUP_SECONDS}s\n{_state(process, log)}")


def _state(process: subprocess.Popen, log: Path) -> str:
    """What the command had printed and which processes it had started when the test gave up."""
    children = "\n".join(
        f"  {pid}: {' '.join(_command_line(pid))[:200]}" for pid in _descendants(process.pid)
    )
    return f"its processes:\n{children or '  none'}\nits output:\n{log.read_text()[-4000:]}"


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _prefect_server(pid: int) -> tuple[int, int] | None:
    """The pid and port of the ephemeral Prefect API among this process's descendants."""
    for child in _descendants(pid):
        argv = _command_line(child)
        if "uvicorn" in argv and "prefect.server.api.server:create_app" in argv:
            return child, int(argv[argv.index("--port") + 1])
    return None


def _prefect_server_port(pid: int) -> int | None:
    found = _prefect_server(pid)
    return found[1] if found else None


# what a user's shell would pass on; the rest of the worker's environment (settings that earlier
# in-process commands filled in, a session cache other tests write to) stays out
PASSED_ON = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "VIRTUAL_ENV", "CI")


def _environment(tmp_path: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in PASSED_ON if key in os.environ}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]),
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        ALIGNFLOW_CACHE=str(tmp_path / "cache"),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DO_NOT_TRACK="1",
        GX_ANALYTICS_ENABLED="False",
    )
    return env


def _command(name: str, tmp_path: Path) -> tuple[list[str], Callable[[int], bool]]:
    """The command line, and when it is ready to be stopped (given its Prefect server's port)."""
    if name == "run":
        return ["run", "--quiet"], lambda port: True
    if name == "serve":
        serve = ["serve", "--config", str(REPO / "configs" / "demo.yaml")]  # checked before it serves
        return serve, lambda _: "prefect deployment run" in (tmp_path / "output.log").read_text()
    (tmp_path / "signal_test_launcher.py").write_text(LAUNCHER, encoding="utf-8")
    port = _free_port()
    command = ["api", "--port", str(port), "--launcher", "signal_test_launcher:make_launcher"]
    return command, lambda _: _answers(f"http://127.0.0.1:{port}/openapi.json")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["api", "run", "serve"])
def test_sigterm_leaves_no_child_process_running(tmp_path, name):
    command, ready = _command(name, tmp_path)
    work, log = tmp_path / "work", tmp_path / "output.log"
    work.mkdir()
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "alignflow.cli", *command],
            cwd=work,
            env=_environment(tmp_path),
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=_default_signals,
        )
    started: list[int] = []
    try:
        port = _wait_for(lambda: _prefect_server_port(process.pid), process, "Prefect server", log)
        _wait_for(
            lambda: _answers(f"http://127.0.0.1:{port}/api/health"), process, "Prefect server answer", log
        )
        _wait_for(lambda: ready(port), process, f"`alignflow {name}` ready", log)
        started = _descendants(process.pid)
        if name == "serve":
            # Ctrl-C signals the terminal's whole process group: the API server must not get it,
            # or the runner's shutdown retries a dead API for over a minute, with tracebacks
            server_pid = _prefect_server(process.pid)[0]
            assert os.getpgid(server_pid) != os.getpgid(process.pid)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {pid: " ".join(_command_line(pid)) for pid in started if _alive(pid)}
        assert not survivors, f"still running after `alignflow {name}` ended: {survivors}"
        # exited, not killed; Prefect's runner, once serving, handles SIGTERM itself and exits 0
        expected = {128 + signal.SIGTERM, 0} if name == "serve" else {128 + signal.SIGTERM}
        assert process.returncode in expected, log.read_text()
        assert not _answers(f"http://127.0.0.1:{port}/api/health")
    finally:
        for pid in [process.pid, *started]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_unwinds_the_command_and_stops_its_whole_process_tree(signum, tmp_path):
    """Run in a process of its own: stopping every descendant of pytest would stop its servers."""
    pids, errors = tmp_path / "pids", tmp_path / "stderr"
    with pids.open("w") as out, errors.open("w") as err:  # files: a survivor would hold a pipe open
        done = subprocess.run(
            [sys.executable, "-c", STOPPED_SCRIPT, str(int(signum))],
            stdout=out,
            stderr=err,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            preexec_fn=_default_signals,
        )
    started = [int(pid) for pid in pids.read_text().split()]
    deadline = time.monotonic() + 5  # a signalled child may still be exiting as the command ends
    while (survivors := [pid for pid in started if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert len(started) == 2, errors.read_text()[-3000:]
    assert not survivors, f"still running after the command ended: {survivors}"
    assert done.returncode == 128 + signum, errors.read_text()[-3000:]


SIGTERM_BEFORE_THE_LOOP = """
import asyncio, os, signal
from alignflow.cli.serve_runner import _StoppableRunner, runner_owns_sigterm

runner = _StoppableRunner(pause_on_shutdown=True)
with runner_owns_sigterm(runner):
    os.kill(os.getpid(), signal.SIGTERM)  # while the schedule is being set up
    asyncio.run(runner.serve([], lambda: print("announced"), print))
print("terminated" if runner.terminated else "serving", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_a_sigterm_before_the_runner_starts_stops_the_schedule_instead_of_being_lost():
    """``alignflow serve`` announces its schedule before Prefect's runner installs its own
    SIGTERM handler: a SIGTERM in between belongs to the runner already, so the schedule stops
    (before this, the caller's handler raised where the exception could be dropped)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_BEFORE_THE_LOOP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["terminated", "True"], done.stdout  # never announced; handler restored
