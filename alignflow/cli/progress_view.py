"""What ``alignflow run`` and ``alignflow train`` show while they work.

Three ways, picked by :func:`progress_display`:

- on a terminal, a live view (rich): every stage of the run, the current one with its
  step n/N, rate and ETA, finished ones with their time or ``cache hit``;
- elsewhere (CI, a log file, a pipe), one plain line per event: stage started, finished
  or answered by the cache, a step line every tenth of a stage, warnings;
- with ``--quiet``, nothing until the end (warnings still go to stderr).

The views subscribe to :mod:`alignflow.progress`, which the library publishes to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from alignflow import progress
from alignflow.progress import ProgressEvent

Mode = Literal["live", "plain", "quiet"]
PLAIN_STEP_FRACTION = 0.1  # a plain step line each tenth of a stage's steps...
PLAIN_STEP_SECONDS = 30.0  # ...or after this long without one


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass
class StageView:
    """One stage as the views know it from the events so far."""

    name: str
    state: str = "pending"  # pending, running, done, cached, failed
    started: float | None = None
    seconds: float | None = None
    step: int | None = None
    total: int | None = None
    first_step: int | None = None
    first_at: float | None = None
    last_at: float | None = None
    note: str = ""

    def rate(self) -> float | None:
        """Steps per second since the first step event of this run of the stage."""
        if self.step is None or self.first_step is None or self.first_at is None or self.last_at is None:
            return None
        done, spent = self.step - self.first_step, self.last_at - self.first_at
        return done / spent if done > 0 and spent > 0 else None

    def eta(self) -> float | None:
        rate = self.rate()
        if rate is None or self.total is None or self.step is None:
            return None
        return max(0, self.total - self.step) / rate

    def elapsed(self, now: float) -> float | None:
        if self.seconds is not None:
            return self.seconds
        return None if self.started is None else now - self.started

    def steps_text(self) -> str:
        if self.step is None:
            return ""
        text = f"step {self.step}/{self.total}" if self.total else f"step {self.step}"
        rate, eta = self.rate(), self.eta()
        if rate is not None:
            text += f", {rate:.2f} steps/s" if rate < 10 else f", {rate:.0f} steps/s"
        if eta is not None and self.state == "running" and self.step != self.total:
            text += f", ETA {format_seconds(eta)}"
        return text


class RunState:
    """The stages of one command, updated from progress events (from any thread)."""

    def __init__(self, planned: Sequence[str] = ()):
        self.stages: dict[str, StageView] = {name: StageView(name) for name in planned}
        self.status = ""
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def apply(self, event: ProgressEvent) -> StageView | None:
        with self.lock:
            if event.stage is None:
                if event.kind == "note":
                    self.status = event.message
                return None
            view = self.stages.setdefault(event.stage, StageView(event.stage))
            if event.kind == "stage_started":
                view.state, view.started, view.seconds = "running", event.at, None
                view.step = view.total = view.first_step = view.first_at = view.last_at = None
                view.note = event.message
                self.status = ""
            elif event.kind in ("stage_finished", "stage_failed"):
                view.seconds = event.seconds
                view.state = {"stage_failed": "failed"}.get(event.kind, "cached" if event.cached else "done")
                view.note = event.message or view.note
            elif event.kind == "step":
                if view.first_step is None:
                    view.first_step, view.first_at = event.step, event.at
                view.step, view.total, view.last_at = event.step, event.total or view.total, event.at
            elif event.kind == "note":
                view.note = event.message
            return view


class PlainView:
    """One line per event: nothing redrawn, no colour, safe for logs and CI."""

    def __init__(self, write: Callable[[str], None], planned: Sequence[str] = ()):
        self.state = RunState(planned)
        self.write = write
        self._printed: dict[str, tuple[int, float]] = {}  # stage -> (last printed step, when)

    def line(self, text: str) -> None:
        self.write(f"[{format_seconds(time.monotonic() - self.state.started):>7}] {text}")

    def __call__(self, event: ProgressEvent) -> None:
        view = self.state.apply(event)
        name = event.stage
        if event.kind == "warning":
            self.line(f"warning: {event.message}")
        elif event.kind == "note":
            self.line(f"{name}: {event.message}" if name else event.message)
        elif view is None:
            return
        elif event.kind == "stage_started":
            self._printed.pop(view.name, None)
            self.line(f"{name}: started" + (f" ({event.message})" if event.message else ""))
        elif event.kind == "stage_finished":
            steps = f", {view.steps_text()}" if view.step is not None else ""
            outcome = "cache hit" if event.cached else "done"
            self.line(f"{name}: {outcome} in {format_seconds(event.seconds)}{steps}")
        elif event.kind == "stage_failed":
            self.line(f"{name}: failed after {format_seconds(event.seconds)}: {event.message}")
        elif event.kind == "step" and self._due(view, event.at):
            self._printed[view.name] = (view.step or 0, event.at)
            self.line(f"{name}: {view.steps_text()}")

    def _due(self, view: StageView, now: float) -> bool:
        last = self._printed.get(view.name)
        if last is None or view.step == view.total:
            return last is None or last[0] != view.step
        every = max(1, int((view.total or 0) * PLAIN_STEP_FRACTION)) if view.total else None
        crossed = every is not None and (view.step or 0) // every > last[0] // every
        return crossed or now - last[1] >= PLAIN_STEP_SECONDS

    def warning(self, message: str) -> None:
        self.line(f"warning: {message}")


_ICONS = {"pending": "[dim]·[/]", "done": "[green]✓[/]", "cached": "[green]✓[/]", "failed": "[red]✗[/]"}


class LiveView:
    """The terminal view: a table of the run's stages, redrawn in place."""

    STEP_REDRAW_SECONDS = 0.05

    def __init__(self, console: Console, title: str, planned: Sequence[str] = ()):
        self.state = RunState(planned)
        self.title = title
        self.console = console
        self.live = Live(
            console=console,
            get_renderable=self.render,
            refresh_per_second=8,
            transient=True,
            # others' output goes to the log file (alignflow.logs.QuietConsole), not above the view
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._spinners: dict[str, Spinner] = {}
        self._drawn = 0.0

    def __call__(self, event: ProgressEvent) -> None:
        view = self.state.apply(event)
        if event.kind == "warning":
            self.warning(event.message)
        elif view is None:
            return
        elif event.kind != "step" or time.monotonic() - self._drawn >= self.STEP_REDRAW_SECONDS:
            self.live.refresh()  # between the timer's redraws: fast steps are seen too

    def warning(self, message: str) -> None:
        self.live.console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)

    def render(self) -> Group:
        now = self._drawn = time.monotonic()
        with self.state.lock:
            stages = list(self.state.stages.values())
            status = self.state.status
        table = Table(box=None, padding=(0, 1), show_header=False, expand=False)
        for column in ("", "stage", "progress", "time", "note"):
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        for view in stages:
            table.add_row(*self._row(view, now))
        clock = format_seconds(now - self.state.started)
        heading = Text.from_markup(f"[bold]{escape(self.title)}[/]  {clock}")
        parts: list[RenderableType] = [heading, table]
        if status:
            parts.append(Text(status, style="dim"))
        return Group(*parts)

    def _row(self, view: StageView, now: float) -> list:
        elapsed = format_seconds(view.elapsed(now))
        note = escape(view.note)
        if view.state == "running":
            spinner = self._spinners.setdefault(view.name, Spinner("dots", style="cyan"))
            if view.step is not None and view.total:
                bar = ProgressBar(total=view.total, completed=view.step, width=24)
                cell = Table.grid(padding=(0, 1))
                cell.add_row(bar, Text(view.steps_text()))
                return [spinner, f"[bold]{view.name}[/]", cell, elapsed, note]
            return [spinner, f"[bold]{view.name}[/]", Text(view.steps_text() or "working…"), elapsed, note]
        if view.state == "cached":
            return [_ICONS["cached"], view.name, "[green]cache hit[/]", elapsed, note]
        if view.state == "done":
            return [_ICONS["done"], view.name, Text(view.steps_text(), style="dim"), elapsed, note]
        if view.state == "failed":
            return [_ICONS["failed"], view.name, "[red]failed[/]", elapsed, note]
        return [_ICONS["pending"], f"[dim]{view.name}[/]", "", "", ""]


class QuietView:
    """No progress at all; warnings still reach stderr."""

    def __init__(self, err: Console):
        self.err = err

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "warning":
            self.warning(event.message)

    def warning(self, message: str) -> None:
        self.err.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


def pick_mode(console: Console, quiet: bool) -> Mode:
    if quiet:
        return "quiet"
    return "live" if console.is_terminal and not console.is_dumb_terminal else "plain"


@contextmanager
def progress_display(
    console: Console, title: str, planned: Sequence[str] = (), quiet: bool = False, err: Console | None = None
) -> Iterator[LiveView | PlainView | QuietView]:
    """Show the progress events published inside the block the way ``console`` allows
    (``err``: where warnings go with ``quiet``)."""
    mode = pick_mode(console, quiet)
    if mode == "live":
        view: LiveView | PlainView | QuietView = LiveView(console, title, planned)
    elif mode == "plain":
        view = PlainView(
            lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True), planned
        )
        view.line(title)
    else:
        view = QuietView(err or Console(stderr=True))
    with progress.listening(view):
        if isinstance(view, LiveView):
            with view.live:
                yield view
        else:
            yield view


@contextmanager
def watched(
    title: str, planned: Sequence[str], quiet: bool, log_name: str, console: Console
) -> Iterator[Path]:
    """Progress on the terminal, everything else into a log file (yielded) meanwhile.

    Enter it after the heavy imports: libraries set up their console handlers on import;
    each stage start sweeps again for those that came later.
    """
    from alignflow.logs import QuietConsole, default_log_file

    with QuietConsole(default_log_file(log_name), load_libraries=True, capture_output=True) as quiet_console:
        screen = Console(file=quiet_console.terminal(stderr=console.stderr))
        err = Console(file=quiet_console.terminal(stderr=True))
        with progress_display(screen, title, planned, quiet, err) as view:
            quiet_console.show = view.warning

            def sweep(event: ProgressEvent) -> None:
                if event.kind == "stage_started":
                    quiet_console.sweep()

            with progress.listening(sweep):
                yield quiet_console.log_file
