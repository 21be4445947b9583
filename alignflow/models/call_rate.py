"""How fast a call runs at best: the timing both GEMM probes share (the peak a stage's MFU is
priced against, and which library multiplies fp32 faster here)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_calls_per_second(
    call: Callable[[], object], seconds: float, *, sync: Callable[[], object] = lambda: None, batch: int = 1
) -> float:
    """The fastest rate ``call`` ran at, per round of ``batch`` calls, over ``seconds`` of rounds
    after one untimed call (which picks kernels and allocates). The best round rather than the
    mean, so a slow start (units warming up, a neighbour's burst) does not lower the ceiling.
    ``sync`` waits for queued device work once a round: a wait per launch would time launches."""
    call()
    sync()
    best, started = 0.0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        round_started = time.perf_counter()
        for _ in range(batch):
            call()
        sync()
        best = max(best, batch / (time.perf_counter() - round_started))
    return best
