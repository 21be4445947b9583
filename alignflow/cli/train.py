"""``alignflow train {sft,reward,dpo,grpo}``: run one training stage on a data snapshot.

stdout carries the result (JSON); progress goes to stderr: a live view on a terminal,
plain lines elsewhere, nothing with ``--quiet``. Library output goes to the log file.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="Run one training stage (library code; no orchestrator needed).", no_args_is_help=True)
err = Console(stderr=True)

_STAGES = {
    "sft": "alignflow.training.sft:run_sft",
    "reward": "alignflow.training.reward:run_reward",
    "dpo": "alignflow.training.dpo:run_dpo",
    "grpo": "alignflow.training.grpo:run_grpo",
}


def _run(
    stage: str,
    config: Path | None,
    overrides: list[str],
    data: Path | None,
    output: Path | None,
    model,
    quiet: bool = False,
):
    import importlib

    from alignflow.logs import quiet_environment

    quiet_environment()  # before transformers and friends are imported
    from alignflow import progress
    from alignflow.cli.progress_view import watched
    from alignflow.config import ConfigError, load_config

    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    data_dir = data or Path(cfg.data.data_dir)
    output_dir = output or Path(cfg.output_dir) / stage
    module_name, _, function = _STAGES[stage].partition(":")
    run = getattr(importlib.import_module(module_name), function)
    try:
        with (
            watched(f"alignflow train {stage}", [stage], quiet, f"train-{stage}", err) as log_file,
            progress.stage(stage),
        ):
            result = run(cfg, data_dir, output_dir, model_path=model)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        json.dumps(
            {"stage": stage, "model_dir": result.model_dir, "metrics": result.metrics, "log": str(log_file)},
            indent=2,
        )
    )


def _command(stage: str):
    def command(
        config: Path | None = typer.Option(None, "--config", "-c", help="pipeline YAML (configs/demo.yaml)"),
        overrides: list[str] = typer.Option([], "--set", help="key=value override, repeatable"),
        data: Path | None = typer.Option(None, "--data", help="snapshot dir (default: data.data_dir)"),
        output: Path | None = typer.Option(
            None, "--output", help="stage output dir (default: output_dir/<stage>)"
        ),
        model: Path | None = typer.Option(
            None, "--model", help="start from this saved model (e.g. the SFT output)"
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress on stderr, only the result"),
    ) -> None:
        _run(stage, config, overrides, data, output, model, quiet)

    command.__doc__ = (
        f"Run the {stage} stage; resumes from the last complete checkpoint in --output. "
        "Shows progress on stderr (live on a terminal) and prints the result as JSON."
    )
    return command


for _name in _STAGES:
    app.command(_name)(_command(_name))
