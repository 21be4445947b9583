"""``alignflow promote`` and ``alignflow rollback``: registry decisions made by people.

``promote`` re-judges a version (the challenger by default) against the configured gates
using the evaluation metrics recorded on it, or with ``--force`` moves ``champion``
without gates (tagged as a manual decision). ``rollback`` moves ``champion`` back to the
version it replaced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

ROLE_HELP = "which registered model: policy or reward"
Role = Literal["policy", "reward"]  # as alignflow.promotion.gates names them


def _settings(config: Path | None, overrides: list[str], tracking_uri: str | None, role: Role):
    from alignflow.cli.errors import fail, load_config_or_exit
    from alignflow.registry.models import registered_name

    cfg = load_config_or_exit(config, overrides)
    try:
        name = registered_name(cfg.project, role)
    except ValueError as exc:
        raise fail(f"project {cfg.project!r}: {exc}", error=exc) from None
    return cfg, tracking_uri or cfg.tracking.resolved_uri(), name


def _require_model(uri: str, name: str) -> None:
    """Exit 2 naming the registered models when ``name`` is none of them (a typo, another project)."""
    from alignflow.registry.names import UnknownModelError, require_registered

    try:
        require_registered(uri, name)
    except UnknownModelError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None


def _judges_of(uri: str, name: str, version: str, metrics: dict[str, float]) -> list[str]:
    """The judges the pipeline trusted for this version, else those independent of its run."""
    from mlflow import MlflowClient

    from alignflow.promotion.gates import trusted_judges
    from alignflow.registry.promotion import JUDGES_TAG

    recorded = MlflowClient(uri).get_model_version(name, version).tags.get(JUDGES_TAG)
    if recorded is not None:
        return [j for j in recorded.split(",") if j and j != "none"]
    return trusted_judges(metrics, own_reward_trusted=False)


def _human_decision(cfg, uri: str, db_url: str | None, version: str, dry_run: bool):
    """The live A/B verdict, from the feedback service's database."""
    from alignflow.service.ab import human_verdict
    from alignflow.service.settings import ServiceSettings

    url = db_url or ServiceSettings.from_env().database_url
    try:
        return human_verdict(cfg.project, url, uri, cfg.promotion, version, dry_run)
    except LookupError as exc:
        from alignflow.cli.errors import fail

        raise fail(f"--human: {exc}", error=exc) from None


def gate_table(decision, title: str) -> Table:
    """Every gate: the value, its 95% interval and judged rows, the bound that decides and what
    it must clear, the verdict. A gate's name is never cut (it is what a user looks up); on a
    narrow console the other cells wrap, none ends in an ellipsis."""
    table = Table(title=title)
    longest = max((len(r.name) for r in decision.results), default=4)
    table.add_column("gate", no_wrap=True, min_width=longest)
    for column in ("value", "95% interval", "n", "needs", "outcome"):
        table.add_column(column, overflow="fold")
    for r in decision.results:
        value = "missing" if r.value is None else f"{r.value:.4g}"
        outcome = "[green]passed[/green]" if r.passed else f"[red]{r.outcome}[/red]"
        n = "" if r.n is None else str(r.n)
        table.add_row(r.name, value, r.interval(), n, r.needs, outcome)
    return table


def promote(
    version: str | None = typer.Option(None, help="version number; default: the challenger"),
    role: Role = typer.Option("policy", help=ROLE_HELP),
    force: bool = typer.Option(False, "--force", help="move champion without checking the gates"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the gate table; change nothing"),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="pipeline config YAML (gates, project) [default: the built-in demo config]",
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="override a config key, e.g. promotion.max_kl=0.5"
    ),
    tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI; default from config"),
    human: bool = typer.Option(
        False, "--human", help="decide by live ratings alone (A/B): the feedback service's database"
    ),
    db_url: str | None = typer.Option(
        None, "--db-url", help="with --human: the feedback service's database (default: its own default)"
    ),
    agent: str | None = typer.Option(None, help="with --human: the agent (default: the config's project)"),
) -> None:
    """Promote a model version to champion if it passes every gate (or unconditionally with --force)."""
    from alignflow.promotion import gates
    from alignflow.registry import models, promotion

    if agent:
        overrides = [*overrides, f"project={agent}"]
    cfg, uri, name = _settings(config, overrides, tracking_uri, role)
    _require_model(uri, name)
    console = Console()
    version = version or models.alias_version(uri, name, models.CHALLENGER)
    if version is None:
        from alignflow.cli.errors import fail

        raise fail(f"{name} has no challenger; pass --version N (a registered version of {name})")
    if force and not dry_run:
        previous = promotion.promote_by_hand(uri, name, version)
        if previous == version:
            console.print(f"{name}: version {version} is already champion; nothing changed")
            return
        console.print(f"{name}: champion -> version {version} (was {previous or 'none'}), gates not checked")
        return
    if human:
        decision = _human_decision(cfg, uri, db_url, version, dry_run)
        judges = list(decision.judges)
    else:
        from alignflow.registry.promotion import recorded_metrics

        metrics = recorded_metrics(uri, name, version)
        judges = _judges_of(uri, name, version, metrics) if role == "policy" else []
        if dry_run:
            champion = models.alias_version(uri, name, models.CHAMPION)
            decision = gates.decide(name, version, metrics, cfg.promotion, role, champion, judges)
        else:
            decision = promotion.promote(uri, name, version, metrics, cfg.promotion, role, judges)
    console.print(gate_table(decision, f"{name} version {version}" + (" (dry run)" if dry_run else "")))
    if decision.judges_counted:
        console.print(f"judges that count: {', '.join(decision.judges_counted)}")
    champion_now = decision.previous_champion or "none"
    if not decision.promoted:
        verb = "would be rejected" if dry_run else "rejected"
        console.print(f"[red]{verb}[/red]: {decision.reason}; champion stays {champion_now}")
        raise typer.Exit(1)
    if decision.previous_champion == version:
        passes = "passes every gate" if decision.results else "has no gates to pass"
        change = "nothing would change" if dry_run else "nothing changed"
        console.print(f"[green]version {version} {passes}[/green] and is already champion; {change}")
        return
    verb = "would be promoted" if dry_run else "promoted"
    console.print(f"[green]{verb}[/green]: champion -> version {version} (was {champion_now})")


def rollback(
    role: Role = typer.Option("policy", help=ROLE_HELP),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="pipeline config YAML (project) [default: the built-in demo config]"
    ),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a config key"),
    tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI; default from config"),
) -> None:
    """Move champion back to the previous champion."""
    from alignflow.registry import promotion

    _, uri, name = _settings(config, overrides, tracking_uri, role)
    _require_model(uri, name)
    try:
        old, new = promotion.rollback(uri, name)
    except LookupError as exc:  # nothing to roll back to: said as every other error is
        from alignflow.cli.errors import fail

        raise fail(str(exc), 1, exc) from None
    Console().print(f"{name}: champion {old} -> {new}")


def register(app: typer.Typer) -> None:
    app.command("promote")(promote)
    app.command("rollback")(rollback)
