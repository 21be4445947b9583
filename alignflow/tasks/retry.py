"""Which failures a task retries: transient I/O and network trouble, never bad data or config."""

from __future__ import annotations

from typing import Any

_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException | None) -> bool:
    """Connection drops, time-outs and other OS-level hiccups (a tracking server restarting)."""
    if exc is None or isinstance(exc, _PERMANENT_OS_ERRORS):
        return False
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only when the failure looks transient."""
    try:
        state.result()
    except Exception as exc:  # the task's own exception, re-raised by the failed state
        return is_transient(exc)
    return False
