"""Keeping the libraries we drive off the user's screen.

transformers, datasets, torch, Prefect, MLflow, DVC and great-expectations narrate: loader
reports, progress bars, deprecation notes, retries. A person running a job wants our
progress and our warnings; the rest belongs in a log file. :class:`QuietConsole` moves
every third-party console handler's output into one log file for the length of a command,
turns the libraries' progress bars off, and hands the ``alignflow`` loggers' warnings to a
callback (the CLI shows them in its own words and layout). :func:`logger_level` quiets one
library logger for one block.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

OURS = ("alignflow",)  # the loggers whose warnings are ours to show (the flows and tasks are inside)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# read by the libraries when they import (set before they do): no bars, warnings only
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "TOKENIZERS_PARALLELISM": "false",
}

_current_log_file: Path | None = None


@contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    """Run the block with logger ``name`` at ``level``, then restore the level it had."""
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


def quiet_environment() -> None:
    """Defaults (the user's own settings win) that keep bars and chatter off from import on."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def quiet_libraries() -> None:
    """The libraries' progress bars off for any command, those already imported included:
    a command without a log file of its own (``data add`` loading the champion reward model)
    must not print transformers' ``Loading weights`` or MLflow's ``Downloading artifacts``."""
    quiet_environment()
    _library_bars_off()


def current_log_file() -> Path | None:
    """The log file of the command running now (None outside :class:`QuietConsole`)."""
    return _current_log_file


def default_log_file(command: str, root: str | Path = ".") -> Path:
    """``.alignflow/logs/<command>-<time>.log`` under ``root`` (the project directory)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(root).resolve() / ".alignflow" / "logs" / f"{command}-{stamp}.log"


def _is_console(handler: logging.Handler) -> bool:
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    stream = getattr(handler, "stream", None)
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    consoles = {id(s) for s in streams if s is not None}
    return id(stream) in consoles or type(handler).__name__ in ("PrefectConsoleHandler", "_SafeStreamHandler")


class _Relay(logging.Handler):
    """Our loggers' warnings, handed to whoever shows them (``QuietConsole.show``)."""

    def __init__(self, owner: QuietConsole):
        super().__init__(logging.WARNING)
        self.owner = owner

    def emit(self, record: logging.LogRecord) -> None:
        if self.owner.show is None:
            return
        try:
            self.owner.show(record.getMessage())
        except Exception:  # a display problem must not become the run's problem
            self.handleError(record)


def _own_terminal_stream(stream: TextIO, fd: int) -> tuple[TextIO, bool]:
    """A stream on the terminal ``stream`` writes to, that survives ``fd`` being redirected.

    Returns the stream and whether it was opened here (a dup of ``fd``) and must be closed.
    A stream not backed by ``fd`` (a test runner's buffer) is used as it is.
    """
    try:
        backed = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        backed = False
    if not backed:
        return stream, False
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return os.fdopen(os.dup(fd), "w", encoding=encoding, errors="replace", buffering=1), True


def _library_bars_off(load: bool = False) -> None:
    """Progress bars of the Hugging Face libraries off, whatever their environment said.

    With ``load`` they are imported first (transformers and datasets import lazily, so this
    costs about a second) and transformers' own stderr handler is created now, where the
    sweep that follows can move it, rather than in the middle of a stage.
    """
    if load or "transformers" in sys.modules:
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            pass
        else:
            hf_logging.get_logger("transformers")  # sets up its stderr handler, for the sweep
            hf_logging.disable_progress_bar()
    if load or "datasets" in sys.modules:
        try:
            import datasets
        except ImportError:
            pass
        else:
            datasets.disable_progress_bars()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


class QuietConsole:
    """For one command: everything but our own output goes into ``log_file``.

    - log records of third-party loggers (their console handlers are moved to the file),
      Python warnings, and our loggers' info lines go to the file; our warnings go to
      ``show`` (the CLI's view prints them in its own layout);
    - with ``capture_output`` (the CLI), whatever anyone else writes to stdout or stderr,
      from Python, C code or a child process (DVC's bars, the ephemeral Prefect server),
      lands in the file too, and :meth:`terminal` hands the CLI a stream on the real one;
    - the Hugging Face libraries' progress bars are turned off.

    Everything is put back at exit. Libraries that set up their console handlers later
    (torch and transformers do on import) are caught by :meth:`sweep`, which is cheap and
    may be called at any time (the CLI calls it as each stage starts).
    """

    def __init__(
        self,
        log_file: str | Path,
        show: Callable[[str], None] | None = None,
        load_libraries: bool = False,
        capture_output: bool = False,
    ):
        self.log_file = Path(log_file)
        self.show = show
        self.load_libraries = load_libraries  # import transformers/datasets now: quiet from the start
        self.capture_output = capture_output
        self._file: logging.FileHandler | None = None
        self._relay = _Relay(self)
        self._removed: list[tuple[logging.Logger, logging.Handler]] = []
        self._changed: dict[logging.Logger, bool] = {}  # logger -> whether it had the file handler
        self._ours_levels: dict[str, int] = {}
        self._terminal: dict[bool, tuple[TextIO, bool]] = {}
        self._saved_streams: tuple[TextIO, TextIO] | None = None
        self._saved_fds: dict[int, int] = {}
        self._output: TextIO | None = None

    def terminal(self, stderr: bool = False) -> TextIO:
        """The stream our own output goes to (the real stdout/stderr while output is captured)."""
        if stderr in self._terminal:
            return self._terminal[stderr][0]
        return sys.stderr if stderr else sys.stdout

    def __enter__(self) -> QuietConsole:
        global _current_log_file
        quiet_environment()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._file = logging.FileHandler(self.log_file, encoding="utf-8")
        self._file.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.root.addHandler(self._file)
        for name in OURS:
            ours = logging.getLogger(name)
            self._ours_levels[name] = ours.level
            if ours.getEffectiveLevel() > logging.INFO:
                ours.setLevel(logging.INFO)  # our info lines belong in the file
            ours.addHandler(self._relay)
        logging.captureWarnings(True)
        if self.capture_output:
            self._capture()
        self.sweep()  # before the libraries are loaded: what they say on loading goes to the file
        _library_bars_off(load=self.load_libraries)
        self.sweep()
        _current_log_file = self.log_file
        return self

    def _capture(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._terminal = {
            False: _own_terminal_stream(sys.stdout, 1),
            True: _own_terminal_stream(sys.stderr, 2),
        }
        self._output = open(self.log_file, "a", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        for fd in (1, 2):
            try:
                self._saved_fds[fd] = os.dup(fd)
                os.dup2(self._output.fileno(), fd)
            except OSError:  # no such descriptor (a detached process): Python-level capture only
                self._saved_fds.pop(fd, None)
        self._saved_streams = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self._output

    def _release(self) -> None:
        if self._saved_streams is not None:
            sys.stdout, sys.stderr = self._saved_streams
            self._saved_streams = None
        if self._output is not None:
            self._output.flush()
        for fd, saved in self._saved_fds.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved_fds = {}
        for stream, opened_here in self._terminal.values():
            stream.flush()
            if opened_here:
                stream.close()
        self._terminal = {}
        if self._output is not None:
            self._output.close()
            self._output = None

    def sweep(self) -> None:
        """Move every console handler outside our packages to the log file; bars off."""
        if self._file is None:
            return
        _library_bars_off()
        loggers = [logging.root] + [
            logger
            for name, logger in list(logging.root.manager.loggerDict.items())
            if isinstance(logger, logging.Logger) and name.split(".")[0] not in OURS
        ]
        for logger in loggers:
            consoles = [h for h in logger.handlers if _is_console(h)]
            if not consoles:
                continue
            for handler in consoles:
                logger.removeHandler(handler)
                self._removed.append((logger, handler))
            if logger is not logging.root and logger not in self._changed:
                self._changed[logger] = self._file in logger.handlers
                if not logger.propagate:  # it printed on its own: now it writes to the file on its own
                    logger.addHandler(self._file)

    def __exit__(self, *exc: object) -> None:
        global _current_log_file
        self._release()
        for logger, handler in reversed(self._removed):
            logger.addHandler(handler)
        for logger, had_file in self._changed.items():
            if not had_file and self._file in logger.handlers:
                logger.removeHandler(self._file)
        for name, level in self._ours_levels.items():
            ours = logging.getLogger(name)
            ours.setLevel(level)
            ours.removeHandler(self._relay)
        logging.captureWarnings(False)
        if self._file is not None:
            logging.root.removeHandler(self._file)
            self._file.close()
        self._removed, self._changed = [], {}
        _current_log_file = None
