"""How every command reports a bad input: one line on stderr, ``error: <source>: <what>; <fix>``.

The source is what the user typed or wrote (``--set dpo.betaa=0.2``, ``configs/x.yaml:3:5``,
``data.jsonl:7``); the traceback and the library's own report are left out unless
``alignflow --debug`` asked for them.
"""

from __future__ import annotations

import difflib
import os
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

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


def _command_words(ctx: Any) -> list[str]:
    """The subcommand names below the program (``["data", "validate"]``), however it was started."""
    words: list[str] = []
    while ctx is not None and ctx.parent is not None:
        words.insert(0, ctx.info_name)
        ctx = ctx.parent
    return words


def _click_words(message: str) -> str:
    """Click's sentence as a clause of the one line: no capital, no full stop, no pydantic prefix."""
    text = message.strip().removeprefix("Value error, ").rstrip(".")
    return text[:1].lower() + text[1:]


def _param_name(param: Any) -> str:
    """An option as typed (``--role``), an argument as named (``AGENT``)."""
    opts = getattr(param, "opts", None)
    if param.param_type_name == "option" and opts:
        return max(opts, key=len)
    return (param.name or "").upper()


def _no_such_command(exc: Any) -> tuple[str, str, str] | None:
    """``(source, what, guess)`` when ``exc`` is click's "No such command 'x'."."""
    match = re.match(r"No such command '(.*?)'\.", exc.message)
    if match is None or exc.ctx is None:
        return None
    close = difflib.get_close_matches(match.group(1), exc.ctx.command.list_commands(exc.ctx), n=1)
    return match.group(1), "no such command", f"did you mean {close[0]}? " if close else ""


def usage_error_line(exc: Any, words: list[str] | None = None) -> str:
    """Click's usage error (unknown option, missing argument, bad value) as ``source: what; fix``,
    the fix pointing at the command's ``--help`` (and click's guess, where it has one); ``words``
    name the command when click gave the error no context."""
    from typer._click.exceptions import BadOptionUsage, BadParameter, MissingParameter, NoSuchOption

    words = _command_words(exc.ctx) if exc.ctx is not None else (words or [])
    source, what, guess = "", _click_words(exc.format_message()), ""
    param = getattr(exc, "param", None)
    if isinstance(exc, NoSuchOption):
        source, what = exc.option_name, "no such option"
        guess = f"did you mean {' or '.join(sorted(exc.possibilities))}? " if exc.possibilities else ""
    elif isinstance(exc, MissingParameter) and param is not None:
        what = f"missing {param.param_type_name} {_param_name(param)}"
    elif isinstance(exc, BadParameter) and param is not None:
        source, what = _param_name(param), _click_words(exc.message)
    elif isinstance(exc, BadOptionUsage):
        source, what = exc.option_name, _click_words(exc.message).replace(f"option '{exc.option_name}' ", "")
    else:
        source, what, guess = _no_such_command(exc) or (source, what, guess)
    named = " ".join(part for part in (*words, source) if part)
    fix = f"{guess}see `{' '.join(['alignflow', *words])} --help`"
    return f"{named}: {what}; {fix}" if named else f"{what}; {fix}"


class OneLineUsageErrors(TyperGroup):
    """The root command: click's usage errors are answered like every other bad input, one
    ``error:`` line on exit 2, not Typer's boxed report (``alignflow --help`` keeps its look)."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        with _usage_errors_as_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors_as_one_line(_subcommands(ctx, [*ctx._protected_args, *ctx.args])):
            return super().invoke(ctx)


def _subcommands(ctx: Any, args: list[str]) -> list[str]:
    """The subcommand names that ``args`` start with: the command a usage error without its
    context (``run --config`` with no value) came from."""
    words, command = [], ctx.command
    for arg in args:
        found = command.get_command(ctx, arg) if hasattr(command, "get_command") else None
        if found is None:
            break
        words.append(arg)
        command = found
    return words


@contextmanager
def _usage_errors_as_one_line(words: list[str] | None = None) -> Iterator[None]:
    """A usage error below becomes ``fail``'s one line; a bare group (help) is left to click."""
    from typer._click.exceptions import NoArgsIsHelpError, UsageError

    try:
        yield
    except NoArgsIsHelpError:
        raise
    except UsageError as exc:
        raise fail(usage_error_line(exc, words), EXIT_USAGE) from None  # no traceback: click's own
