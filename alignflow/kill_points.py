"""Named moments at which a chaos test may SIGKILL the process, as databases keep fail points.

A kill at a random time almost never lands in the few milliseconds between two registry writes,
yet those are the moments where a rerun could double a version or leave one undecided. Setting
``ALIGNFLOW_KILL_AT=<name>`` makes the process kill itself (SIGKILL: no clean-up, no atexit, as a
preempted worker dies) when it reaches that point; the rerun, without the variable, goes on.
Unset, a point costs one lookup. The names: :data:`POINTS`.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "ALIGNFLOW_KILL_AT"

POINTS = {
    "register.logged": "a model logged to the stage run, no registry version made yet",
    "register.versioned": "a version made, before it becomes the challenger",
    "register.done": "every version registered, before the register task returns",
    "promote.tagged": "the decision's gate tags written, before the alias moves",
    "promote.decided": "champion moved (or the rejection tagged), before the description is written",
    "promote.described": "the description written, before the model card",
}


def kill_point(name: str) -> None:
    """SIGKILL this process here when ``ALIGNFLOW_KILL_AT`` names this point."""
    if name not in POINTS:
        raise ValueError(f"unknown kill point {name!r}; known: {sorted(POINTS)}")
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
