"""How every command reports a bad input: one line on stderr, ``error: <source>: <what>; <fix>``.

The source is what the user typed or wrote (``--set dpo.betaa=0.2``, ``configs/x.yaml:3:5``,
``data.jsonl:7``); the traceback and the library's own report are left out unless
``alignflow --debug`` asked for them.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

DEBUG_ENV = "ALIGNFLOW_DEBUG"
EXIT_USAGE = 2


def debug_enabled() -> bool:
    """Whether ``alignflow --debug`` (or ``ALIGNFLOW_DEBUG=1``) asked for tracebacks."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def fail(message: str, code: int = EXIT_USAGE, error: BaseException | None = None) -> typer.Exit:
    """Print ``error: message`` as one line on stderr (with ``error``'s traceback under --debug);
    the exit to raise."""
    err = Console(stderr=True)
    if error is not None and debug_enabled():
        err.print("".join(traceback.format_exception(error)), markup=False, highlight=False, soft_wrap=True)
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code)


def load_config_or_exit(path: str | Path | None, overrides: list[str] | None = None) -> Any:
    """The pipeline config, or exit 2 with the one-line reason (source, what is wrong, fix)."""
    from alignflow.config import ConfigError, load_config

    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        raise fail(str(exc), EXIT_USAGE, exc) from None
