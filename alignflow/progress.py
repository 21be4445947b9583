"""Progress of a long run as events: stage started/finished, step n/N, notes and warnings.

The library publishes; whoever wants to show progress subscribes. Nothing is shown and
almost nothing is spent while nobody listens (a notebook user sees no change). The CLI
subscribes a live terminal view or a plain line printer; a stage runner (the retraining
flow, ``alignflow train``) wraps each stage in :func:`stage`, and training loops report
their steps with :func:`step` (transformers stages through ``TrackingCallback``).

Listeners are called in the publishing thread and must be quick; an exception in a
listener is logged and never reaches the training loop. Events do not cross processes:
a stage run under ``accelerate launch`` or on a remote work pool shows as started and
finished, without steps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger(__name__)

EventKind = Literal["stage_started", "stage_finished", "stage_failed", "step", "note", "warning"]
Listener = Callable[["ProgressEvent"], None]


@dataclass(frozen=True)
class ProgressEvent:
    """One thing that happened; ``at`` is ``time.monotonic()`` when it was published."""

    kind: EventKind
    stage: str | None = None
    step: int | None = None
    total: int | None = None
    seconds: float | None = None
    cached: bool = False
    message: str = ""
    at: float = field(default_factory=time.monotonic)


_lock = threading.Lock()
_listeners: list[Listener] = []
_running: list[str] = []  # stages started and not yet finished, innermost last


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with every event from now on; returns the function that stops it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """``listener`` receives the events published inside the block."""
    unsubscribe = subscribe(listener)
    try:
        yield
    finally:
        unsubscribe()


def active() -> bool:
    """Whether anybody listens (a trainer may then leave its own progress bars off)."""
    return bool(_listeners)


def current_stage() -> str | None:
    """The innermost stage started and not yet finished."""
    with _lock:
        return _running[-1] if _running else None


def publish(event: ProgressEvent) -> None:
    with _lock:
        if event.kind == "stage_started" and event.stage:
            _running.append(event.stage)
        elif event.kind in ("stage_finished", "stage_failed") and event.stage in _running:
            del _running[len(_running) - 1 - _running[::-1].index(event.stage)]  # the innermost
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(event)
        except Exception:  # a display must never stop a training run
            logger.debug("progress listener %r failed", listener, exc_info=True)


def step(n: int, total: int | None = None, stage: str | None = None) -> None:
    """Step ``n`` of ``total`` done in ``stage`` (default: the stage running now)."""
    if _listeners:
        publish(ProgressEvent("step", stage or current_stage(), step=int(n), total=total))


def note(message: str, stage: str | None = None) -> None:
    """Something a person watching the run wants to know (a phase inside a stage, a resume)."""
    if _listeners:
        publish(ProgressEvent("note", stage or current_stage(), message=message))


class StageHandle:
    """What a stage runner tells the stage's end event: whether a cache answered."""

    def __init__(self, name: str):
        self.name = name
        self.cached = False


@contextmanager
def stage(name: str) -> Iterator[StageHandle]:
    """Publish ``name`` as started, then as finished (with its time) or failed (and re-raise).

    Set ``handle.cached = True`` inside the block when a cache answered instead of work.
    """
    handle = StageHandle(name)
    started = time.monotonic()
    publish(ProgressEvent("stage_started", name))
    try:
        yield handle
    except BaseException as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        publish(ProgressEvent("stage_failed", name, seconds=time.monotonic() - started, message=reason))
        raise
    publish(
        ProgressEvent(
            "stage_finished",
            name,
            seconds=time.monotonic() - started,
            cached=handle.cached,
        )
    )
