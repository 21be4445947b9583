"""Progress events (alignflow.progress), the views that show them, and the quiet console."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console

from alignflow import progress
from alignflow.cli.progress_view import LiveView, PlainView, RunState, format_seconds, pick_mode
from alignflow.logs import QuietConsole
from alignflow.progress import ProgressEvent


def events(*items: ProgressEvent) -> list[str]:
    lines: list[str] = []
    view = PlainView(lines.append)
    for event in items:
        view(event)
    return [line.split("] ", 1)[1] for line in lines]


def test_plain_view_prints_one_line_per_event_and_a_step_line_each_tenth():
    steps = [ProgressEvent("step", "sft", step=n, total=100, at=10.0 + n / 2) for n in range(0, 101)]
    said = events(
        ProgressEvent("stage_started", "data"),
        ProgressEvent("stage_finished", "data", seconds=0.1, cached=True),
        ProgressEvent("stage_started", "sft"),
        *steps,
        ProgressEvent("stage_finished", "sft", seconds=52.0),
        ProgressEvent("warning", "sft", message="the reward model saw 3 pairs"),
        ProgressEvent("stage_started", "reward"),
        ProgressEvent("stage_failed", "reward", seconds=1.5, message="out of memory"),
    )
    step_lines = [s for s in said if s.startswith("sft: step")]
    assert [s.split(",")[0] for s in step_lines] == [f"sft: step {n}/100" for n in range(0, 101, 10)]
    assert step_lines[5] == "sft: step 50/100, 2.00 steps/s, ETA 25.0s"
    assert "ETA" not in step_lines[-1], "no ETA once the last step is done"
    assert said[:3] == ["data: started", "data: cache hit in 0.1s", "sft: started"]
    assert said[-4:] == [
        "sft: done in 52.0s, step 100/100, 2.00 steps/s",
        "warning: the reward model saw 3 pairs",
        "reward: started",
        "reward: failed after 1.5s: out of memory",
    ]


def test_a_slow_stage_gets_a_step_line_at_least_every_thirty_seconds():
    said = events(
        ProgressEvent("stage_started", "policy"),
        ProgressEvent("step", "policy", step=0, total=1000, at=0.0),
        ProgressEvent("step", "policy", step=1, total=1000, at=31.0),
        ProgressEvent("step", "policy", step=2, total=1000, at=32.0),
    )
    shown = [s.split(",")[0] for s in said]
    assert shown == ["policy: started", "policy: step 0/1000", "policy: step 1/1000"]


def test_rate_and_eta_count_from_the_first_step_seen_so_a_resumed_stage_is_not_too_fast():
    state = RunState(["sft"])
    state.apply(ProgressEvent("stage_started", "sft", at=0.0))
    state.apply(ProgressEvent("step", "sft", step=150, total=250, at=1.0))
    view = state.apply(ProgressEvent("step", "sft", step=160, total=250, at=6.0))
    assert view.rate() == pytest.approx(2.0)
    assert view.eta() == pytest.approx(45.0)
    assert view.steps_text() == "step 160/250, 2.00 steps/s, ETA 45.0s"
    assert format_seconds(3725) == "1h02m" and format_seconds(75) == "1m15s"


def test_the_live_view_lists_the_planned_stages_and_the_current_ones_steps():
    console = Console(record=True, width=120, force_terminal=True, color_system=None)
    view = LiveView(console, "alignflow run — demo", ["data", "sft", "reward"])
    for event in (
        ProgressEvent("stage_started", "data", at=0.0),
        ProgressEvent("stage_finished", "data", seconds=0.2, cached=True),
        ProgressEvent("stage_started", "sft", at=1.0),
        ProgressEvent("step", "sft", step=0, total=10, at=2.0),
        ProgressEvent("step", "sft", step=4, total=10, at=4.0),
    ):
        view.state.apply(event)
    console.print(view.render())
    text = console.export_text()
    assert "alignflow run — demo" in text
    lines = {line.split()[1]: line for line in text.splitlines() if len(line.split()) > 1}
    assert "cache hit" in lines["data"]
    assert "step 4/10, 2.00 steps/s, ETA 3.0s" in lines["sft"]
    assert "reward" in lines and "step" not in lines["reward"], "planned, not started"


def test_mode_follows_the_terminal_and_quiet():
    assert pick_mode(Console(force_terminal=True), quiet=False) == "live"
    assert pick_mode(Console(force_terminal=False), quiet=False) == "plain"
    assert pick_mode(Console(force_terminal=True), quiet=True) == "quiet"


def test_stage_events_carry_cache_hits_and_failures_and_a_broken_listener_stops_nothing():
    seen: list[ProgressEvent] = []

    def broken(event: ProgressEvent) -> None:
        raise RuntimeError("display gone")

    with progress.listening(seen.append), progress.listening(broken):
        with progress.stage("evaluate") as shown:
            assert progress.current_stage() == "evaluate"
            progress.step(3, 8)
            shown.cached = True
        with pytest.raises(ValueError), progress.stage("promote"):
            raise ValueError("registry down\nmore")
    progress.step(1, 2)  # nobody listens: nothing happens
    assert [(e.kind, e.stage) for e in seen] == [
        ("stage_started", "evaluate"),
        ("step", "evaluate"),
        ("stage_finished", "evaluate"),
        ("stage_started", "promote"),
        ("stage_failed", "promote"),
    ]
    assert seen[2].cached and seen[1].step == 3 and seen[1].total == 8
    assert seen[4].message == "registry down"
    assert progress.current_stage() is None


def test_the_trainer_callback_reports_its_steps():
    from alignflow.registry.trainer_callback import TrackingCallback

    seen: list[ProgressEvent] = []
    callback = TrackingCallback()
    with progress.listening(seen.append), progress.stage("sft"):
        callback.on_train_begin(None, SimpleNamespace(global_step=0, max_steps=5), None)
        for n in (1, 2):
            callback.on_step_end(None, SimpleNamespace(global_step=n, max_steps=5), None)
    assert [(e.stage, e.step, e.total) for e in seen if e.kind == "step"] == [
        ("sft", 0, 5),
        ("sft", 1, 5),
        ("sft", 2, 5),
    ]


def test_quiet_console_moves_library_output_to_the_log_file_and_shows_ours(tmp_path, capfd):
    chatty = logging.getLogger("chatty_library")  # prints on its own, as transformers does
    handler = logging.StreamHandler(sys.stderr)
    chatty.addHandler(handler)
    chatty.propagate = False
    shown: list[str] = []
    log_file = tmp_path / "logs" / "run.log"
    try:
        with QuietConsole(log_file, shown.append) as quiet:
            chatty.warning("Some weights were newly initialized: consider training")
            logging.getLogger("alignflow.training").warning("resumed from checkpoint-50")
            late = logging.getLogger("late_library")  # set up after the command started
            late.addHandler(logging.StreamHandler(sys.stderr))
            late.propagate = False
            quiet.sweep()
            late.warning("late chatter")
        chatty.warning("after the command")
    finally:
        chatty.removeHandler(handler)
        chatty.propagate = True
    err = capfd.readouterr().err
    assert "newly initialized" not in err and "late chatter" not in err
    assert "after the command" in err, "the library's own handler is back afterwards"
    assert shown == ["resumed from checkpoint-50"]
    text = log_file.read_text()
    assert "newly initialized" in text and "late chatter" in text and "resumed from checkpoint-50" in text


def test_captured_output_from_python_c_and_child_processes_goes_to_the_log_file(tmp_path, capfd):
    import os
    import subprocess

    log_file = tmp_path / "run.log"
    with QuietConsole(log_file, capture_output=True) as quiet:
        print("a library's print")
        sys.stderr.write("a bar drawn on stderr\r")
        os.write(2, b"C code writing to fd 2\n")
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        quiet.terminal().write("ours, on the terminal\n")
    print("after the command")
    captured = capfd.readouterr()
    seen = captured.out + captured.err
    assert "ours, on the terminal" in seen and "after the command" in seen
    for chatter in ("a library's print", "a bar drawn on stderr", "C code writing", "a child process"):
        assert chatter not in seen
        assert chatter in log_file.read_text()
