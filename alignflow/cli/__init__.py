"""The ``alignflow`` command line: the top layer's face (it may import flows).

Each command group lives in its own module and keeps heavy imports (torch, prefect,
mlflow) inside its functions so that ``alignflow --help`` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="alignflow",
    help="Preference training of language models as tracked, versioned, gated pipelines.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Preference training of language models as tracked, versioned, gated pipelines."""


# module name -> how it attaches: a sub-app ("data" -> `alignflow data ...`) or top-level commands
_GROUPS: dict[str, str | None] = {
    "doctor": None,
    "pipeline": None,
    "api": None,
    "registry": None,
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
