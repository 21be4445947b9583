"""``alignflow train STAGE``: run one registered training stage (sft, reward, dpo, grpo, ppo, ...).

``--data`` takes a snapshot folder or a data file; a file is validated and snapshotted on the
fly (the same readers, checks and split as ``alignflow data add``, without versioning).
stdout carries the result (JSON); progress goes to stderr: a live view on a terminal,
plain lines elsewhere, nothing with ``--quiet``. Library output goes to the log file.

Exit codes: 0 trained, 1 the stage or the data failed, 2 usage error (config, unknown stage).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from typer import _click as click  # typer ships its own click; its groups take that one's types
from typer.core import TyperGroup

from alignflow.training.registry import stage_spec, stages


class StageGroup(TyperGroup):
    """``alignflow train``'s commands: one per registered stage, looked up when asked for, so
    a stage registered after this module was imported (a plugin, a test) is there too."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(stages())

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """An unknown stage is one error line naming the closest stage, not click's usage box."""
        if args and not args[0].startswith("-") and args[0] not in stages():
            import difflib

            from alignflow.cli.errors import fail

            close = difflib.get_close_matches(args[0], list(stages()), n=1)
            fix = f"did you mean {close[0]}? " if close else ""
            raise fail(f"train {args[0]}: no such stage; {fix}stages: {', '.join(stages())}")
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in stages():
            return None
        single = typer.Typer()
        single.command(cmd_name)(_command(cmd_name))
        return typer.main.get_command(single)


app = typer.Typer(
    cls=StageGroup,
    help="Run one training stage (library code; no orchestrator needed).",
    no_args_is_help=True,
)
err = Console(stderr=True)
EXIT_FAILED, EXIT_USAGE = 1, 2
SNAPSHOT_DIR = "data"  # where a --data file's snapshot goes, inside the stage's output folder


def snapshot_file(path: Path, data_config, into: Path) -> Path:
    """Validate a data file and write its train/eval/quarantine snapshot into ``into``.

    A file that fails validation trains nothing: the summary names the reasons and the
    report beside the snapshot lists every quarantined row.
    """
    from alignflow.data.pipeline import write_snapshot
    from alignflow.data.readers import FormatError
    from alignflow.data.validation import summarize, validate_paths, write_full_report

    try:
        validated = validate_paths([path], data_config)
    except FormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from exc
    if not validated.passed:
        report = write_full_report(validated, into.with_name("failed-report.json"))
        typer.echo(
            f"error: {path} failed validation; nothing trained\n{summarize(validated, report).summary}",
            err=True,
        )
        typer.echo(f"every quarantined row: {report}", err=True)
        raise typer.Exit(EXIT_FAILED)
    write_snapshot(validated, data_config, into, Path.cwd())
    return into


def _run(
    stage: str,
    config: Path | None,
    overrides: list[str],
    data: Path | None,
    output: Path | None,
    model,
    quiet: bool = False,
):
    from alignflow.logs import quiet_environment

    quiet_environment()  # before transformers and friends are imported
    from alignflow import progress
    from alignflow.cli.errors import load_config_or_exit
    from alignflow.cli.progress_view import watched

    cfg = load_config_or_exit(config, overrides)
    output_dir = output or Path(cfg.output_dir) / stage
    data_dir = data or Path(cfg.data.data_dir)
    if not data_dir.exists():
        from alignflow.cli.errors import fail

        source = f"--data {data_dir}" if data else f"data.data_dir ({data_dir})"
        raise fail(
            f"{source}: no such file or folder; pass --data with a data file or a snapshot folder "
            "(`alignflow data add FILE` writes one to data/)"
        )
    if data_dir.is_file():
        data_dir = snapshot_file(data_dir, cfg.data, output_dir / SNAPSHOT_DIR)
    run = stage_spec(stage).load_runner()
    try:
        with (
            watched(f"alignflow train {stage}", [stage], quiet, f"train-{stage}", err) as log_file,
            progress.stage(stage),
        ):
            result = run(cfg, data_dir, output_dir, model_path=model)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from exc
    typer.echo(
        json.dumps(
            {
                "stage": stage,
                "model_dir": result.model_dir,
                "data_dir": str(data_dir),
                "metrics": result.metrics,
                "log": str(log_file),
            },
            indent=2,
        )
    )


def _command(stage: str):
    def command(
        config: Path | None = typer.Option(
            None, "--config", "-c", help="pipeline config YAML [default: the built-in demo config]"
        ),
        overrides: list[str] = typer.Option(
            [], "--set", metavar="KEY=VALUE", help="key=value override, repeatable"
        ),
        data: Path | None = typer.Option(
            None, "--data", help="a snapshot dir, or a data file to validate and snapshot first"
        ),
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
