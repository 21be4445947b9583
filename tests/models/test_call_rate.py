"""A rate is the best a call reaches once warm, not an average over its warm-up."""

from __future__ import annotations

import types

from alignflow.models import call_rate


def test_a_slow_start_does_not_lower_the_measured_rate(monkeypatch):
    calls, now = [], [0.0]  # a clock of its own: a loaded machine cannot stretch the rounds
    monkeypatch.setattr(call_rate, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def warming_up():  # slow for its first calls, as AMX was for its first 0.6 s on a Xeon
        calls.append(1)
        now[0] += 0.025 if len(calls) <= 8 else 0.002

    rate = call_rate.best_calls_per_second(warming_up, seconds=0.3)
    assert len(calls) > 9, "the probe ran past the slow start"
    assert rate > 300, f"{rate:.0f} calls/s: the warm rate is ~500/s, the slow start's 40/s"


def test_rounds_of_calls_are_synced_once_each():
    synced = []
    rate = call_rate.best_calls_per_second(
        lambda: None, seconds=0.05, sync=lambda: synced.append(1), batch=10
    )
    assert rate > 0 and len(synced) >= 2  # once after the untimed call, then once a round
