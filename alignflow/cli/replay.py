"""``alignflow replay``: rebuild a registered version from its lineage; do the weights match?

The version's pipeline run is run again, as ``alignflow run --force`` with the config it logged,
in a scratch workspace of its own (its own MLflow store, Prefect home, data and outputs; nothing
of the workspace it reads from is written), and the rebuilt version's weights are hashed against
the registered ones. Exit 0: bit for bit the same; 1: different (the report says what differed
before anything ran: code, base model, data); 2: the lineage lacks a piece (named).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
EXIT_DIFFERENT = 1


def _run_pipeline(config_path: Path, scratch: Path, quiet: bool) -> dict:
    """``alignflow run --force`` in ``scratch``; its summary."""
    from alignflow.cli.errors import fail
    from alignflow.flows.environment import workspace_environment

    summary_path = scratch / "summary.json"
    command = [sys.executable, "-m", "alignflow.cli", "run", "--config", str(config_path), "--force"]
    command += ["--summary-json", str(summary_path), *(["--quiet"] if quiet else [])]
    done = subprocess.run(command, cwd=scratch, env=workspace_environment(), check=False)
    if done.returncode != 0 or not summary_path.exists():
        logs = scratch / ".alignflow" / "logs"
        raise fail(f"the replayed run in {scratch} failed (exit {done.returncode}); its logs: {logs}")
    return json.loads(summary_path.read_text(encoding="utf-8"))


def _latest_version(tracking_uri: str, name: str) -> str | None:
    from mlflow import MlflowClient

    versions = MlflowClient(tracking_uri).search_model_versions(f"name = '{name}'")
    return str(max(int(v.version) for v in versions)) if versions else None


def _report_table(report) -> Table:
    lineage = report.lineage
    table = Table(title=f"replay of models:/{lineage.name}/{lineage.version}", show_header=False)
    table.add_row("pipeline run", lineage.pipeline_run)
    table.add_row("data version", f"{lineage.data_version} (replayed: {report.replayed_data_version})")
    table.add_row("config hash", lineage.config_hash)
    table.add_row("code digest / commit", f"{lineage.code_digest} / {lineage.git_commit}")
    table.add_row("base weights", lineage.base_weights or "built offline from the config and seed")
    table.add_row("registered weights sha256", lineage.weights_sha256)
    table.add_row("replayed weights sha256", report.replayed_weights or "-")
    return table


def register(app: typer.Typer) -> None:
    @app.command()
    def replay(
        ref: str = typer.Argument(..., help="the version: models:/NAME/VERSION or models:/NAME@ALIAS"),
        tracking_uri: str | None = typer.Option(
            None, "--tracking-uri", help="the store holding it (default: the default config's)"
        ),
        work_dir: Path | None = typer.Option(
            None, "--work-dir", help="keep the replay's workspace here (default: a temporary folder, removed)"
        ),
        report_json: Path | None = typer.Option(None, "--json", help="also write the report here as JSON"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress of the replayed run"),
    ) -> None:
        """Rebuild a registered version from what its lineage records (data version, config,
        code, seeds, base model) and report whether its weights come out bit for bit the same.

        Run it where the version's run read its files from (a relative data source is found
        from here). Exit 0: the same; 1: different; 2: the lineage lacks a piece (named).
        """
        from alignflow.cli.errors import fail, load_config_or_exit
        from alignflow.registry.evaluations import parse_registered, registered_version
        from alignflow.registry.replay import (
            LineageIncomplete,
            compare,
            config_matches_hash,
            copy_pinned_set,
            differences_here,
            read_lineage,
            registered_weights_sha256,
            replay_config,
        )

        try:
            parsed = parse_registered(ref)
        except ValueError as exc:
            raise fail(str(exc), error=exc) from None
        if parsed is None:
            raise fail(f"{ref!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
        uri = tracking_uri or load_config_or_exit(None).tracking.resolved_uri()
        try:
            found = registered_version(uri, ref, *parsed)
            lineage = read_lineage(uri, parsed[0], str(found.version))
        except (FileNotFoundError, LineageIncomplete) as exc:
            raise fail(str(exc), error=exc) from None
        before = differences_here(lineage)
        if not config_matches_hash(lineage, uri):
            before.append(
                f"the logged config does not hash to the version's config.hash ({lineage.config_hash})"
            )
        for note in before:
            console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)

        with tempfile.TemporaryDirectory(prefix="alignflow-replay-") as tmp:
            scratch = (work_dir or Path(tmp)).resolve()
            scratch.mkdir(parents=True, exist_ok=True)
            config_path = scratch / "replay-config.yaml"
            config = replay_config(lineage, scratch, Path.cwd())
            copy_pinned_set(lineage, scratch, Path.cwd())
            config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
            summary = _run_pipeline(config_path, scratch, quiet)
            scratch_uri = config["tracking"]["uri"]
            version = _latest_version(scratch_uri, lineage.name)
            weights = registered_weights_sha256(scratch_uri, lineage.name, version) if version else None
        report = compare(lineage, weights, summary.get("data_version"))
        report.notes[:0] = before
        console.print(_report_table(report))
        for note in report.notes:
            console.print(f"  {escape(note)}", soft_wrap=True)
        if report_json:
            report_json.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        replayed = f"models:/{lineage.name}/{lineage.version}"
        if report.matches:
            console.print(f"[green]{replayed}: the same weights, bit for bit[/]")
            return
        console.print(f"[red]{replayed}: the replay's weights differ[/]")
        raise typer.Exit(EXIT_DIFFERENT)
