"""The demo's committed DVC pointers (``data.dvc``, ``golden.dvc``): check them, or refresh them.

A fresh clone has the pointers but not the folders; the demo's first run rebuilds the folders
from its built-in data, and restores the pinned versions only while the data stage writes the
same bytes. After a change that moves them (the demo generator, validation, the split, the
snapshot format), refresh the pointers and commit them:

    python -m tools.demo_pins check      # exit 1 naming each stale pointer
    python -m tools.demo_pins refresh    # rewrite them (make pins)
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from alignflow.config import load_config
from alignflow.evaluation.pins import expected_demo_pins, stale_demo_pins

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "configs" / "demo.yaml"

app = typer.Typer(add_completion=False, no_args_is_help=True)


@app.command()
def check() -> None:
    """Exit 1, naming each pointer, when the demo's data stage no longer writes what is pinned."""
    config = load_config(DEMO_CONFIG)
    stale = stale_demo_pins(ROOT, config.data, config.evaluation)
    for message in stale:
        typer.echo(message, err=True)
    if stale:
        raise typer.Exit(1)
    typer.echo("data.dvc and golden.dvc match what the demo's data stage writes")


@app.command()
def refresh() -> None:
    """Rewrite the pointers to what the demo's data stage writes now."""
    config = load_config(DEMO_CONFIG)
    for name, pin in expected_demo_pins(config.data, config.evaluation, copy_to=ROOT).items():
        typer.echo(f"{name}: {pin.md5}")


if __name__ == "__main__":
    sys.exit(app())
