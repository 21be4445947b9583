"""``alignflow run`` (the main job) and ``alignflow serve`` (the nightly schedule, locally)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from alignflow import progress
from alignflow.cli.progress_view import watched
from alignflow.cli.shutdown import stop_descendants, stopping_children
from alignflow.errors import InputError

if TYPE_CHECKING:  # the config module loads pydantic models of every stage: only when a run starts
    from alignflow.config import PipelineConfig

console = Console()


def render_summary(summary: dict[str, Any]) -> None:
    """The end-of-run table: stages, times, cache hits, key metrics, promotions, UI commands."""
    from alignflow.flows.environment import prefect_ui_command
    from alignflow.flows.summary import key_metrics
    from alignflow.registry.decision_card import outcome_statement

    table = Table(title=f"alignflow run — {summary['project']}")
    for column in ("stage", "time (s)", "cache", "key metrics"):
        table.add_column(column)
    for stage in summary["stages"]:
        cache = "[green]hit[/]" if stage["cached"] else "ran"
        table.add_row(
            stage["name"], f"{stage['seconds']:.1f}", cache, key_metrics(stage["name"], stage["metrics"])
        )
    if summary["stages"]:
        console.print(table)
    console.print(f"data version (DVC md5): [bold]{summary['data_version'] or 'none (not versioned)'}[/]")
    if summary.get("golden"):
        golden = summary["golden"]
        console.print(
            f"pinned evaluation set: [bold]{golden['version']}[/] ({golden['prompts']} prompts, "
            f"{golden['answers']} with answers, {golden['pairs']} pairs; {golden['source']})"
        )
    if summary.get("nothing_to_do"):
        console.print(f"[bold]Nothing to do:[/] {summary['nothing_to_do']}")
    if summary.get("stopped"):
        console.print(f"[bold red]Stopped before training:[/] {summary['stopped']['message']}")
    if summary.get("random_weights"):
        console.print(f"[bold yellow]Random weights:[/] {escape(summary['random_weights'])}", soft_wrap=True)
    if summary.get("rl_stage"):
        console.print(escape(summary["rl_stage"]))
    for decision in summary.get("promotions", {}).values():
        colour = "green" if decision["promoted"] else "yellow"
        said = escape(outcome_statement(decision))
        console.print(f"{decision['name']} v{decision['version']}: [{colour}]{said}[/]", soft_wrap=True)
        if decision.get("judges"):
            console.print(f"  judges that counted: {', '.join(decision['judges'])}")
        for gate in decision.get("gates", []):
            mark = "[green]pass[/]" if gate["outcome"] == "passed" else f"[red]{gate['outcome']}[/]"
            console.print(f"  {mark} {escape(gate['describe'])}")
    hits = sum(1 for s in summary["stages"] if s["cached"])
    if summary.get("nothing_to_do") or summary.get("stopped"):
        console.print(f"wall {summary['wall_seconds']:.1f}s, no training stage ran, cache hits {hits}")
    else:
        console.print(
            f"wall {summary['wall_seconds']:.1f}s, stage compute {summary['compute_seconds']:.1f}s, "
            f"orchestration overhead {summary['orchestration_overhead']:.1%}, cache hits {hits}"
        )
        if summary.get("startup_seconds"):
            startup = summary["startup_seconds"]
            console.print(f"before the flow: {startup:.1f}s (loading, Prefect's API, the flow run starting)")
    uri = summary.get("tracking_uri") or "sqlite:///mlflow.db"
    console.print("\nOpen the UIs:")
    console.print(f"  mlflow ui --backend-store-uri {uri} --port 5000")
    console.print(f"  {prefect_ui_command()}", soft_wrap=True, highlight=False)


def planned_stages(config: PipelineConfig) -> list[str]:
    """The stages a run goes through, in order (the live view lists them from the start)."""
    from alignflow.plan import RunPlan

    return RunPlan(config).stage_names


def _unchanged_run(config: PipelineConfig) -> dict[str, Any] | None:
    """The summary of a run with nothing to do, decided before Prefect starts (None: work to do)."""
    from alignflow.flows.unchanged import check_before_flow

    progress.note("checking data and registry…")
    summary = check_before_flow(config, ".")
    return summary.to_dict() if summary else None


def _run_flow(config: Path | None, overrides: list[str], force: bool) -> dict[str, Any]:
    import psutil

    from alignflow.flows.environment import local_flow_settings
    from alignflow.flows.prefect_db import seed_workspace_home
    from alignflow.flows.retrain import retrain

    progress.note("starting the retraining flow (Prefect)…")
    seed_workspace_home()
    with local_flow_settings():
        # this process exists for the command: its start is when the user asked for the run
        started = psutil.Process().create_time()
        return retrain(str(config) if config else None, overrides, force=force, requested_at=started)


def _report_input_failure(error: BaseException, log_file: Path | None) -> None:
    """The cause alone on the console; its traceback through Prefect's engine, which would
    bury it, in the log file."""
    import traceback

    if log_file is not None:
        with log_file.open("a", encoding="utf-8") as log:
            traceback.print_exception(error, file=log)
    console.print(f"[red]error:[/] {escape(str(error))}", soft_wrap=True)
    if log_file is not None:
        console.print(f"log (with the traceback): {log_file}", soft_wrap=True, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        config: Path | None = typer.Option(
            None, "--config", "-c", help="pipeline config YAML [default: the built-in demo config]"
        ),
        overrides: list[str] = typer.Option(
            [], "--set", metavar="KEY=VALUE", help="override a config key, e.g. dpo.beta=0.2"
        ),
        summary_json: Path | None = typer.Option(None, help="also write the run summary here as JSON"),
        force: bool = typer.Option(
            False, "--force", help="run the flow even when the champion comes from this data and config"
        ),
        quiet: bool = typer.Option(
            False, "--quiet", "-q", help="no progress while running; only the summary at the end"
        ),
    ) -> None:
        """Run the whole retraining flow (validate → … → promote) on the configured services.

        On a terminal a live view shows each stage, the current one with step n/N, rate and
        ETA; elsewhere (CI, logs) one plain line per event. Library output goes to the log
        file under .alignflow/logs/, named at the end.
        """
        from alignflow.flows.environment import apply_defaults

        apply_defaults()
        os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
        from alignflow.cli.errors import load_config_or_exit

        pipeline_config = load_config_or_exit(config, overrides)
        import alignflow.flows.retrain  # noqa: F401 - Prefect sets up its logging on import: before the sweep
        import alignflow.flows.unchanged  # noqa: F401

        title = f"alignflow run — {pipeline_config.project}"
        log_file = None
        try:
            with (
                stopping_children(),
                watched(title, planned_stages(pipeline_config), quiet, "run", console) as log_file,
            ):
                summary = None if force else _unchanged_run(pipeline_config)
                if summary is None:
                    summary = _run_flow(config, list(overrides), force)
        except InputError as error:  # bad data, settings or model: the message says which
            _report_input_failure(error, log_file)
            raise typer.Exit(1) from None
        render_summary(summary)
        console.print(f"log: {log_file}", soft_wrap=True, highlight=False)
        if summary_json:
            summary_json.write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        if summary.get("stopped"):
            raise typer.Exit(1)

    @app.command()
    def serve(
        config: Path = typer.Option(Path("configs/demo.yaml"), "--config", "-c", help="pipeline config YAML"),
        overrides: list[str] = typer.Option(
            [],
            "--set",
            metavar="KEY=VALUE",
            help="override a config key in each run it starts, e.g. dpo.beta=0.2",
        ),
        cron: str = typer.Option("0 3 * * *", help="when to retrain (cron, UTC)"),
        name: str = typer.Option("nightly", help="deployment name"),
        ab_agent: list[str] = typer.Option(
            [], "--ab-agent", help="also judge this agent's live A/B on a schedule (repeatable)"
        ),
        ab_cron: str = typer.Option("0 * * * *", help="when to judge the A/B tests (cron, UTC)"),
        db_url: str | None = typer.Option(None, "--db-url", help="the feedback service's database"),
    ) -> None:
        """Serve the retraining schedule (and A/B checks) from this process (Ctrl-C to stop)."""
        from alignflow.flows.environment import apply_defaults

        apply_defaults()  # before Prefect is imported: it reads its settings then
        os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
        from alignflow.cli.errors import load_config_or_exit
        from alignflow.cli.serve_runner import serve_until_stopped
        from alignflow.flows.retrain import retrain
        from alignflow.flows.sync_calls import resolved

        # checked now: a bad --set fails here, not at the first scheduled run
        pipeline_config = load_config_or_exit(config, overrides)
        console.print(f"serving retrain/{name} on cron '{cron}' with {config}")
        deployments = [
            resolved(
                retrain.to_deployment(
                    name=name,
                    cron=cron,
                    parameters={"config_path": str(config), "overrides": list(overrides)},
                )
            )
        ]
        if ab_agent:
            from alignflow.flows.ab_check import ab_check
            from alignflow.service.settings import ServiceSettings

            uri = pipeline_config.tracking.resolved_uri()
            url = db_url or ServiceSettings.from_env().database_url
            for agent in ab_agent:
                console.print(f"serving ab-check/{agent} on cron '{ab_cron}'")
                parameters = {
                    "agent_id": agent,
                    "database_url": url,
                    "tracking_uri": uri,
                    "config_path": str(config),
                }
                deployments.append(
                    resolved(ab_check.to_deployment(name=agent, cron=ab_cron, parameters=parameters))
                )
        names = ", ".join(f"{d.flow_name}/{d.name}" for d in deployments)

        def announce() -> None:
            console.print(
                f"serving {names}: polling for scheduled runs; start one now with "
                f"`prefect deployment run {deployments[0].flow_name}/{name}`; Ctrl-C stops",
                soft_wrap=True,
            )

        def report_run(line: str) -> None:
            console.print(line, soft_wrap=True, highlight=False, markup=False)

        with stopping_children():
            serve_until_stopped(deployments, announce, report_run)
            stop_descendants()  # Ctrl-C returns here: a flow run in progress may live on
