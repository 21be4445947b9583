"""``alignflow api``: serve the feedback and policy service with uvicorn."""

from __future__ import annotations

import importlib
import secrets
from pathlib import Path

import typer

from alignflow.cli.errors import fail, load_config_or_exit
from alignflow.cli.shutdown import stopping_children
from alignflow.runtime_config import DEFAULT_TRACKING_URI
from alignflow.service.settings import DEFAULT_DATABASE_URL

# launchers by name; any other value is module:attribute of a launcher (or a factory)
LAUNCHERS = {"flow": "alignflow.flows.feedback_launcher:make_launcher"}
DEFAULT_LAUNCHER = "flow"  # the retraining flow, gates included


def _load_launcher(spec: str, settings):
    """A launcher by name (:data:`LAUNCHERS`), or ``module:attribute`` naming a launcher object
    or a factory taking the settings."""
    module_name, _, attribute = LAUNCHERS.get(spec, spec).partition(":")
    if not module_name or not attribute:
        raise fail(f"--launcher {spec}: expected 'flow', 'library' or module:attribute")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise fail(
            f"--launcher {spec}: cannot load it ({exc}); expected module:attribute", error=exc
        ) from None
    return target if hasattr(target, "launch") else target(settings)


def serve(
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8000, help="TCP port"),
    db_url: str | None = typer.Option(
        None, "--db-url", help=f"SQLAlchemy URL [default: {DEFAULT_DATABASE_URL}]", show_default=False
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="bearer tokens, one per line: TOKEN, or TOKEN:AGENT,AGENT to scope it "
        "(else ALIGNFLOW_API_TOKEN; with neither, one is generated and printed)",
    ),
    token: list[str] = typer.Option(
        [],
        "--token",
        metavar="TOKEN",
        help="a bearer token (repeatable); visible to other users in `ps`: "
        "prefer ALIGNFLOW_API_TOKEN or --token-file",
    ),
    tracking_uri: str | None = typer.Option(
        None, help=f"MLflow tracking URI [default: {DEFAULT_TRACKING_URI}]", show_default=False
    ),
    work_dir: str | None = typer.Option(None, help="where exports and trained models go"),
    min_feedback: int | None = typer.Option(None, help="feedback samples needed before training"),
    launcher: str = typer.Option(
        DEFAULT_LAUNCHER,
        help="'flow' (the retraining flow and its gates), 'library' (in-process, without Prefect) or "
        f"module:attribute of a training launcher [default: {DEFAULT_LAUNCHER}]",
        show_default=False,
    ),
    config: str | None = typer.Option(
        None, "--config", help="pipeline config of training jobs (default: the embedded demo config)"
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="override a pipeline config key for training jobs (repeatable)"
    ),
    wait_for_training: bool = typer.Option(
        False,
        "--wait-for-training",
        help="answer POST train_policy when the job ends, as spec 002 clients expect (?wait=true)",
    ),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve the feedback/training/policy HTTP API (OpenAPI at /docs and /openapi.json).

    Bearer tokens come from ALIGNFLOW_API_TOKEN (or ALIGNFLOW_API_TOKENS, ';'-separated) or
    --token-file, so that they never show in the process list.
    """
    import uvicorn

    from alignflow.service.app import create_app
    from alignflow.service.settings import ServiceSettings, TokenSpec, read_token_file

    values: dict = {}
    if db_url:
        values["database_url"] = db_url
    if tracking_uri:
        values["tracking_uri"] = tracking_uri
    if work_dir:
        values["work_dir"] = work_dir
    if min_feedback is not None:
        values["min_feedback"] = min_feedback
    if config:
        values["pipeline_config"] = config
    if overrides:
        values["pipeline_overrides"] = list(overrides)
    try:
        tokens = [TokenSpec.parse(t) for t in token]
    except ValueError as exc:
        raise fail(f"--token: {exc}", error=exc) from None
    if token:
        typer.echo(
            "warning: --token shows the token to every user of this machine (`ps -ef`); "
            "put it in ALIGNFLOW_API_TOKEN or a --token-file instead",
            err=True,
        )
    if token_file is not None:
        try:
            tokens += read_token_file(token_file)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise fail(
                f"--token-file {token_file}: {why}; "
                "write one token per line there (or set ALIGNFLOW_API_TOKEN)",
                error=exc,
            ) from None
        except ValueError as exc:
            raise fail(f"--token-file {token_file}: {exc}", error=exc) from None
    if tokens:
        values["tokens"] = tokens
    try:
        settings = ServiceSettings.from_env(**values)
    except ValueError as exc:  # an ALIGNFLOW_API_* variable: the message names it
        raise fail(str(exc), error=exc) from None
    if wait_for_training:
        settings.training.wait_by_default = True
    load_config_or_exit(settings.pipeline_config, settings.pipeline_overrides)  # now, not at the first job
    if not settings.tokens:
        generated = secrets.token_urlsafe(32)
        settings = settings.model_copy(update={"tokens": [TokenSpec(token=generated, name="generated")]})
        typer.echo(
            "no ALIGNFLOW_API_TOKEN or --token-file given; this run accepts the generated token: "
            f"{generated}",
            err=True,
        )
    if launcher != "library":
        from alignflow.flows.environment import apply_defaults

        apply_defaults()
    # uvicorn re-raises SIGTERM after its graceful shutdown: without this its default action
    # would end the process and leave the jobs' Prefect server running
    with stopping_children():
        chosen = _load_launcher(launcher, settings) if launcher != "library" else None
        uvicorn.run(create_app(settings, chosen), host=host, port=port, log_level=log_level)


def traffic(
    agent: str = typer.Argument(..., help="the agent whose traffic to show or split"),
    challenger_share: float | None = typer.Option(
        None, min=0.0, max=1.0, help="set the challenger's share of traffic (0 ends the experiment)"
    ),
    db_url: str | None = typer.Option(None, "--db-url", help="the feedback service's database"),
) -> None:
    """Show or set how an agent's generate traffic splits between champion and challenger."""
    from alignflow.service.migrate import upgrade_database
    from alignflow.service.settings import ServiceSettings
    from alignflow.service.storage import Store, make_engine

    engine = make_engine(db_url or ServiceSettings.from_env().database_url)
    try:
        upgrade_database(engine)
        store = Store(engine)
        if challenger_share is not None:
            store.set_challenger_share(agent, challenger_share)
        share = store.challenger_share(agent)
    finally:
        engine.dispose()
    typer.echo(f"{agent}: champion {1 - share:.0%}, challenger {share:.0%}")


def register(app: typer.Typer) -> None:
    app.command("api")(serve)
    app.command("traffic")(traffic)
