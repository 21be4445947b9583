"""Stopping a long-running command stops every process it started.

A command's children (Prefect's ephemeral API server, a uvicorn subprocess; DVC, git or
training workers) are stopped by their owners only on an orderly interpreter exit
(``atexit``). SIGTERM's default action, and uvicorn re-raising SIGTERM after its graceful
shutdown, end the process without one, orphaning the children with their ports held.

:func:`stopping_children` turns SIGTERM into an exception that unwinds the command as
Ctrl-C does (``finally`` blocks run: MLflow runs end, Prefect marks its flow run crashed),
then terminates every descendant still there and kills those that ignore it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil

GRACE_SECONDS = 5.0


class Terminated(SystemExit):
    """SIGTERM arrived: exit with 128 + the signal number, as a shell reports it."""


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(128 + signum)


def stop_descendants(grace: float = GRACE_SECONDS) -> list[int]:
    """Terminate every process below this one, kill those still alive after ``grace`` s.

    The whole tree is listed before any signal is sent: a grandchild whose parent dies
    first is re-parented to init and would no longer be found below us.
    """
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    for process in descendants:
        with suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(descendants, timeout=grace)
    for process in alive:
        with suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [process.pid for process in descendants]


@contextmanager
def stopping_children(grace: float = GRACE_SECONDS) -> Iterator[None]:
    """Run a command so that SIGTERM or Ctrl-C stops it and every process it started.

    Only the main thread can own signal handlers; elsewhere (and where SIGTERM is ignored
    on purpose, e.g. under ``nohup``-like launchers) the handler is left as it is.
    """
    previous = None
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGTERM)
        if current is not signal.SIG_IGN:
            previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except KeyboardInterrupt:
        stop_descendants(grace)
        raise SystemExit(128 + signal.SIGINT) from None
    except SystemExit:  # ours (SIGTERM) or a library's own handler's (Prefect's runner)
        stop_descendants(grace)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
