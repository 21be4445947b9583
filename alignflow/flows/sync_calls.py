"""Prefect's dual sync/async calls, typed for the synchronous code that makes them.

``run_deployment``, ``Flow.to_deployment`` and a task called with ``return_state=True`` give
back their value when called from synchronous code and a coroutine when called from async
code, and their annotations say both. Our flows and commands are synchronous: :func:`resolved`
tells the type checker which one arrived, and fails loudly should a coroutine ever come back.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def resolved(value: T | Coroutine[Any, Any, T]) -> T:
    """``value`` itself, as a synchronous caller receives it from a Prefect call."""
    if isinstance(value, Coroutine):
        value.close()
        raise TypeError("a Prefect call returned a coroutine in synchronous code: it must be awaited")
    return value
