"""The ``alignflow`` command line: the top layer's face (it may import flows).

Each command group lives in its own module and keeps heavy imports (torch, prefect,
mlflow) inside its functions so that ``alignflow --help`` stays fast.
"""

from __future__ import annotations

import importlib
import os

import typer

from alignflow.cli.errors import OneLineUsageErrors


def _flags_take_no_value() -> None:
    """Help shows a flag (``--force``, ``--help``) bare: Typer 0.29 labels every option with
    its type, so a flag read as taking a value (``--force <bool>``)."""
    from typer import _click
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: _click.Context) -> str | None:
        return None if self.is_bool_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()

app = typer.Typer(
    name="alignflow",
    help="Preference training of language models as tracked, versioned, gated pipelines.",
    cls=OneLineUsageErrors,  # an unknown option or missing argument: one error line, as any bad input
    no_args_is_help=True,
    add_completion=False,
    # help is Markdown: a docstring's lines join into paragraphs however the source wraps
    # them, and ``code`` shows as code, not as backquotes
    rich_markup_mode="markdown",
)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False,
        "--debug",
        help="On a bad input, also print the traceback and the library's own report; "
        "leave the libraries' progress bars on.",
    ),
) -> None:
    """Preference training of language models as tracked, versioned, gated pipelines."""
    from alignflow.flows.environment import use_workspace_prefect_home

    use_workspace_prefect_home()  # before any command imports Prefect: it reads PREFECT_HOME then
    if debug:
        from alignflow.cli.errors import DEBUG_ENV

        os.environ[DEBUG_ENV] = "1"
    else:
        from alignflow.logs import quiet_libraries

        quiet_libraries()


# module name -> how it attaches: a sub-app ("data" -> `alignflow data ...`) or top-level commands
_GROUPS: dict[str, str | None] = {
    "doctor": None,
    "pipeline": None,
    "api": None,
    "registry": None,
    "replay": None,
    "data": "data",
    "train": "train",
    "eval": "eval",
    "model": "model",
}


def _register() -> None:
    for module_name, group in _GROUPS.items():
        module = importlib.import_module(f"alignflow.cli.{module_name}")
        if group:
            app.add_typer(module.app, name=group)
        else:
            module.register(app)


_register()


def main() -> None:
    app()
