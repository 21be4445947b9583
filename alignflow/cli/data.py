"""``alignflow data``: generate the demo data, validate input, version a snapshot, show versions.

Exit codes: 0 valid, 1 validation failed, 2 usage error or unreadable input.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from alignflow.errors import InputError

app = typer.Typer(help="Validate, version and inspect preference data.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
SHOWN_EXAMPLES = 5  # per reason on the console; the report file holds every quarantined row
DEFAULT_REPORT = Path(".alignflow") / "reports" / "validate-report.json"
FORMAT_HELP = "reader: jsonl, json, parquet, csv, tsv, datasets (default: detected)"


def _config(config_path: Path | None, overrides: list[str]):
    from alignflow.cli.errors import load_config_or_exit

    return load_config_or_exit(config_path, overrides).data


def _where(example: dict) -> str:
    where = example["file"] if example["row"] is None else f"{example['file']}:{example['row']}"
    return where + (f" [{example['field']}]" if example.get("field") else "")


def _print_report(report: dict, full_report: str | Path | None = None, rows_at: str | None = None) -> None:
    """Counts per reason, the first few examples of each, then where every row is listed."""
    verdict = "[green]PASSED[/green]" if report["passed"] else "[red]FAILED[/red]"
    console.print(
        f"validation {verdict}: {report['input_rows']} rows read, {report['kept']} kept, "
        f"{report['quarantined']} quarantined ({report['bad_fraction']:.2%}; limit "
        f"{report['max_bad_fraction']:.2%})"
    )
    if report["kinds"]:
        console.print("kinds: " + ", ".join(f"{k}={v}" for k, v in report["kinds"].items()))
    for path in report["unreadable_files"]:
        err.print(f"[red]unreadable:[/red] {path}")
    for path in report["truncated_files"]:
        err.print(f"[red]truncated:[/red] {path}")
    if report["counts_by_reason"]:
        table = Table("reason", "rows")
        for code, count in report["counts_by_reason"].items():
            table.add_row(code, str(count))
        console.print(table)
        # one example per line, never wrapped, so file:row stays copyable and greppable
        for code, count in report["counts_by_reason"].items():
            shown = report["examples"].get(code, [])[:SHOWN_EXAMPLES]
            for ex in shown:
                console.print(f"{code}: {_where(ex)}: {ex['message']}", markup=False, soft_wrap=True)
            if count > len(shown):
                console.print(f"{code}: … {count - len(shown)} more", markup=False, soft_wrap=True)
    for warning in report["warnings"]:
        console.print(f"[yellow]warning {warning['code']}:[/yellow] {warning['message']}")
    if rows_at:
        console.print(f"every quarantined row: {rows_at}", soft_wrap=True, highlight=False)
    if full_report:
        console.print(f"full report: {full_report}", soft_wrap=True, highlight=False)


def _read_report(path: str | Path | None) -> dict | None:
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None


@app.command()
def demo(
    out_dir: Path = typer.Argument(..., help="folder for the demo JSONL files"),
    rows: int = typer.Option(None, help="pairwise rows (default: data.demo_rows)"),
    seed: int = typer.Option(0, help="generator seed"),
) -> None:
    """Write the built-in demo data set (pairs, scored feedback, prompts, held-out eval)."""
    from alignflow.config import load_config
    from alignflow.data.demo import write_demo_dataset

    config = load_config(None).data  # the embedded default's demo data
    paths = write_demo_dataset(
        out_dir,
        n_pairs=rows or config.demo_rows,
        n_scored=config.demo_scored_rows,
        seed=seed,
        eval_fraction=config.eval_fraction,
        phrasings=config.demo_phrasings,
        task=config.demo_task,
    )
    for name, path in paths.items():
        console.print(f"{name:>8}: {path}")


@app.command()
def validate(
    path: list[Path] = typer.Argument(..., help="files or directories to validate"),
    fmt: str = typer.Option(None, "--format", help=FORMAT_HELP),
    report: Path = typer.Option(None, "--report", help="write the JSON report here"),
    config_path: Path = typer.Option(
        None, "--config", help="pipeline config YAML [default: the built-in demo config]"
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="override a config key, e.g. data.max_chars=100"
    ),
) -> None:
    """Validate preference data and report bad rows by reason, file and row.

    The console shows the counts per reason and the first few rows of each; the JSON
    report (--report, else .alignflow/reports/validate-report.json when a row is bad) lists
    every quarantined row under ``quarantined_rows``.
    """
    from alignflow.data.readers import FormatError
    from alignflow.data.validation import exit_code, validate_paths, write_full_report

    config = _config(config_path, overrides)
    try:
        # streamed: no record is kept, so a file larger than memory validates too
        validated = validate_paths(list(path), config, fmt, keep_records=False)
    except FormatError as exc:
        from alignflow.cli.errors import fail

        raise fail(str(exc), EXIT_USAGE, exc) from None
    written = None
    if report or validated.issues:
        written = write_full_report(validated, (report or DEFAULT_REPORT).resolve())
    _print_report(validated.report, written)
    raise typer.Exit(exit_code(validated.report))


def _registry_exists(uri: str) -> bool:
    """Whether a tracking store is there to ask (a local sqlite file that exists, or a server);
    ``data add`` must not create an empty ``mlflow.db`` just to find no champion in it. A server
    that does not answer is an error now, not after MLflow's retries (about four minutes)."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).exists()
    if uri.startswith(("http://", "https://")):
        from alignflow.cli.doctor import check_mlflow

        check = check_mlflow(uri)
        if not check.ok:
            raise InputError(f"tracking.uri: {check.detail}; {check.fix}, or pass --set tracking.uri=...")
        return True
    return uri.startswith(("postgresql", "mysql"))


def _data_checks(config_path: Path | None, overrides: list[str], repo: Path):
    """The checks ``alignflow run`` makes on new data, made by ``data add`` too, so no version is
    made unchecked: training rows against the pinned set, labels against the pairs' answers and
    the champion reward model (``check_labels``, ``check_training``)."""
    from alignflow.config import load_config
    from alignflow.plan import RunPlan
    from alignflow.tasks.data import data_guards

    plan = RunPlan(load_config(config_path, overrides), repo)
    judge = None
    if plan.label_judge_role is not None and _registry_exists(plan.config.tracking.resolved_uri()):
        from alignflow.flows.retrain import label_judge

        judge = label_judge(plan)
    return data_guards(plan.config, str(repo), judge)


SHOWN_PAIRS = 3  # the label check's pairs shown on the console; the report holds more


def _said(example: dict, side: str) -> str:
    """A side of a pair as the label check saw it: its text, its number, the judge's score."""
    notes = []
    if example.get(f"{side}_says") is not None:
        notes.append(f"says {example[f'{side}_says']}")
    if example.get(f"reward_{side}") is not None:
        notes.append(f"reward {example[f'reward_{side}']:.3f}")
    return f"{side} {example[side]!r}" + (f" ({', '.join(notes)})" if notes else "")


def _print_pairs(exc: Exception) -> None:
    """A few of the pairs a label check refused or could not judge: where each is, both sides
    with the judge's scores, and the reference answer where one decided."""
    examples = getattr(exc, "examples", None) or []
    for example in examples[:SHOWN_PAIRS]:
        where = example.get("where") or (f"id {example['id']}" if example.get("id") else "pair")
        line = f"  {where} [chosen, rejected]: prompt {example['prompt']!r}: "
        line += f"{_said(example, 'chosen')} over {_said(example, 'rejected')}"
        if example.get("answer") is not None:
            line += f"; the answer is {example['answer']} ({example.get('answer_from') or 'metadata.answer'})"
        err.print(line, markup=False, soft_wrap=True, highlight=False)
    if len(examples) > SHOWN_PAIRS:
        err.print(f"  … more in {getattr(exc, 'report_path', None)}", markup=False, soft_wrap=True)


@app.command()
def add(
    path: list[Path] = typer.Argument(..., help="files or directories to version"),
    fmt: str = typer.Option(None, "--format", help=FORMAT_HELP),
    repo: Path = typer.Option(Path("."), "--repo", help="git/DVC repo to version the snapshot in"),
    no_push: bool = typer.Option(False, "--no-push", help="do not push to the DVC remote"),
    config_path: Path = typer.Option(
        None, "--config", help="pipeline config YAML [default: the built-in demo config]"
    ),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a config key"),
    accept_unjudged: str = typer.Option(
        None,
        "--accept-unjudged",
        metavar="REASON",
        help="version pairs that no judge can judge (no verifiable answer, no reward model shown "
        "competent on pairs like them) anyway, for this reason: it is recorded on the data version "
        "and shown on every model version trained on it",
    ),
) -> None:
    """Validate -> normalise -> split -> write data/ -> dvc add -> push; prints the data version."""
    from alignflow.data.pipeline import DataValidationFailed, add_dataset
    from alignflow.data.readers import FormatError
    from alignflow.errors import DataCheckStop

    if accept_unjudged is not None and not accept_unjudged.strip():
        err.print("--accept-unjudged needs a reason: why can these labels be trusted?")
        raise typer.Exit(EXIT_USAGE)
    config = _config(config_path, overrides)
    try:
        labels, training = _data_checks(config_path, overrides, repo)
    except InputError as exc:  # e.g. a tracking server that does not answer
        from alignflow.cli.errors import fail

        raise fail(str(exc), EXIT_USAGE, exc) from None
    try:
        version = add_dataset(
            list(path), config, repo, fmt, push=not no_push, check_labels=labels, check_training=training,
            accept_unjudged=accept_unjudged.strip() if accept_unjudged else None,
        )  # fmt: skip
    except FormatError as exc:
        from alignflow.cli.errors import fail

        raise fail(str(exc), EXIT_USAGE, exc) from None
    except DataCheckStop as exc:
        err.print(Text.assemble(("not versioned", "red"), f": {exc}"), soft_wrap=True)
        _print_pairs(exc)
        raise typer.Exit(EXIT_INVALID) from None
    except DataValidationFailed as exc:
        failed = _read_report(exc.result.report_path)
        if failed is None:
            err.print(exc.result.summary, markup=False, soft_wrap=True)
        else:
            _print_report(failed, exc.result.report_path)
        err.print(
            "[red]not versioned[/red]: the report keeps the first rows of each reason; "
            "`alignflow data validate PATH --report FILE` lists every one",
            soft_wrap=True,
        )
        raise typer.Exit(exc.result.exit_code) from None
    shown = _read_report(version.report_path)
    if shown is None:
        console.print(version.validation.summary, markup=False, soft_wrap=True)
    else:
        from alignflow.data.snapshot import QUARANTINE, split_path

        rows_at = str(split_path(version.data_dir, QUARANTINE)) if shown["quarantined"] else None
        _print_report(shown, version.report_path, rows_at)
    counts = ", ".join(f"{k}={v}" for k, v in version.counts.items())
    console.print(f"snapshot: {version.data_dir} ({counts})")
    if version.accepted_unjudged:
        console.print(Text.assemble(("accepted unjudged", "yellow"), f": {version.accepted_unjudged}"))
    console.print(f"data version: [bold]{version.version}[/bold]")


@app.command()
def show(
    repo: Path = typer.Option(Path("."), "--repo", help="git/DVC repo holding data.dvc"),
    data_dir: str = typer.Option("data", help="snapshot folder inside the repo"),
) -> None:
    """Current data version, its counts, and the history of `data add`."""
    from alignflow.data.pipeline import dataset_status

    status = dataset_status(repo, data_dir)
    if status["version"] is None:
        err.print(f"no data version in {repo.resolve()}: run `alignflow data add PATH` first")
        raise typer.Exit(EXIT_INVALID)
    console.print(f"data version: [bold]{status['version']}[/bold]")
    manifest = status["manifest"]
    if manifest:
        console.print("counts: " + ", ".join(f"{k}={v}" for k, v in manifest["counts"].items()))
        console.print("sources: " + ", ".join(s["path"] for s in manifest["sources"]))
        if manifest["quarantine_by_reason"]:
            console.print(
                "quarantine: " + ", ".join(f"{k}={v}" for k, v in manifest["quarantine_by_reason"].items())
            )
        accepted = manifest.get("accepted_unjudged")
        if accepted:
            console.print(Text.assemble(("accepted unjudged", "yellow"), f": {accepted['reason']}"))
            console.print(f"  left unjudged: {accepted['unjudged']}", markup=False, soft_wrap=True)
    else:
        console.print("[yellow]snapshot not checked out[/yellow]: run `dvc pull`")
    if status["history"]:
        table = Table("added", "version", "sources", "counts")
        for item in status["history"]:
            current = " (current)" if item["version"] == status["version"] else ""
            table.add_row(
                item["added_at"],
                item["version"] + current,
                ", ".join(item["sources"]),
                ", ".join(f"{k}={v}" for k, v in item["counts"].items()),
            )
        console.print(table)
