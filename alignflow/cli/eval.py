"""``alignflow eval reward|policy``: evaluate any model on any benchmark file.

The file is read and validated like any input (``alignflow data validate``): bad rows are
quarantined and reported by reason, file and row; only valid rows are evaluated. The
report goes to ``report.json`` and ``report.md`` in ``--output``; with tracking configured
and a registered model (``models:/NAME@ALIAS``) it is also logged as an evaluation run of
that version, against its logged model.

Exit codes: 0 evaluated (some rows may have been quarantined: the report says how many
and why); 1 nothing to evaluate (every row bad, or no row of the needed kind); 2 usage
error (bad option or --set, unreadable or missing file, model not found or not the kind of
model asked for: a policy given as reward model, broken or NaN weights); 3 the evaluation
itself failed (the traceback is printed).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(help="Evaluate any model on any benchmark file.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_NOTHING_TO_EVALUATE, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
SHOWN_EXAMPLES = 3  # per quarantine reason on the console; report.json lists every row
EXIT_HELP = (
    "Exit codes: 0 evaluated (quarantined rows are counted in the report), "
    "1 nothing to evaluate (every row bad or none of the needed kind), "
    "2 usage error (bad option, unreadable file, model not found or not the kind asked for), "
    "3 the evaluation failed (traceback printed)."
)
MODEL_HELP = "a saved model folder, or models:/NAME@ALIAS (or models:/NAME/VERSION) from the registry"
DATA_HELP = "benchmark file or folder: JSONL, JSON, Parquet, CSV, TSV, gzip of these, a datasets dir"
SET_HELP = "override a config key, e.g. data.column_mapping.query=prompt (repeatable)"
OUTPUT_HELP = "folder for report.json and report.md (default: .alignflow/eval/<kind>-<benchmark>)"
TRACKING_HELP = "MLflow tracking URI (else MLFLOW_TRACKING_URI); logging needs it and a models:/ model"
MAX_ROWS_HELP = "read at most this many input rows (a quick look at a large file)"
NAME_HELP = "benchmark name in metric keys (default: the file name without suffixes)"


def _fail(code: int, message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _config(config_path: Path | None, overrides: list[str]):
    from alignflow.cli.errors import load_config_or_exit

    return load_config_or_exit(config_path, overrides)


def _tracking(cfg, tracking_uri: str | None) -> tuple[str, bool]:
    """The URI registered models are read from, and whether tracking was asked for."""
    configured = tracking_uri or cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    return configured or cfg.tracking.resolved_uri(), bool(configured)


def _read(data: Path, cfg, max_rows: int | None, fmt: str | None, name: str | None):
    from alignflow.data.readers import FormatError
    from alignflow.evaluation.benchmark import read_benchmark

    try:
        bench = read_benchmark(data, cfg.data, max_rows, fmt, name)
    except FormatError as exc:
        raise _fail(EXIT_USAGE, str(exc)) from None
    report = bench.validation
    unreadable = report["unreadable_files"] + report["truncated_files"]
    if unreadable or report["input_rows"] == 0:
        _print_rows(bench.rows(0))
        raise _fail(EXIT_USAGE, f"{data}: cannot be read ({', '.join(unreadable) or 'no rows'})")
    return bench


def _resolve(ref: str, uri: str, work_dir: str):
    from alignflow.registry.evaluations import resolve_model

    try:
        return resolve_model(ref, uri, work_dir)
    except (FileNotFoundError, ValueError) as exc:
        raise _fail(EXIT_USAGE, str(exc)) from None


def _load(loader, *args, **kwargs):
    """A model loaded by ``loader``, or exit 2 naming the folder that is not the model asked for."""
    from alignflow.models.loading import ModelLoadError

    try:
        return loader(*args, **kwargs)
    except ModelLoadError as exc:
        raise _fail(EXIT_USAGE, str(exc)) from None


@contextmanager
def _failures_exit_3():
    """A failure while scoring, generating or logging: its traceback, then exit 3, so that it
    is not read as exit 1 (nothing to evaluate), which is what Typer would give it."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here is reported, with its traceback
        err.print_exception()
        raise _fail(EXIT_FAILED, f"evaluation failed: {type(exc).__name__}: {exc}") from None


def _print_rows(rows: dict[str, Any]) -> None:
    """Where the rows went, then each quarantine reason with its first few rows (file:row)."""
    console.print(
        f"rows: {rows['read']} read, {rows['valid']} valid, {rows['scored']} evaluated, "
        f"{rows['quarantined']} quarantined",
        highlight=False,
    )
    for code, count in rows["quarantined_by_reason"].items():
        shown = [q for q in rows["quarantined_rows"] if q["code"] == code][:SHOWN_EXAMPLES]
        console.print(f"  quarantined {code}: {count}", markup=False, highlight=False)
        for q in shown:
            where = q["file"] if q["row"] is None else f"{q['file']}:{q['row']}"
            field = f" [{q['field']}]" if q["field"] else ""
            console.print(
                f"    {where}{field}: {q['message']}", markup=False, soft_wrap=True, highlight=False
            )


def _cell(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _metrics_table(title: str, metrics: dict[str, float | None]) -> Table:
    """Every figure once, its 95% interval and n beside it."""
    from alignflow.evaluation.intervals import is_bound_key

    table = Table("metric", "value", "95% interval", "n", title=title)
    for key in sorted(k for k in metrics if not is_bound_key(k) and not k.startswith("rows/")):
        low, high, n = (metrics.get(f"{key}/{s}") for s in ("low", "high", "n"))
        interval = f"[{_cell(low)}, {_cell(high)}]" if low is not None else ""
        table.add_row(key, _cell(metrics[key]), interval, "" if n is None else str(int(n)))
    return table


def _subsets_table(subsets: dict[str, Any]) -> Table:
    table = Table(subsets["column"], "pairs", "accuracy", "95% interval", "ECE", "length gap")
    for value, g in subsets["groups"].items():
        a = g["accuracy"]
        interval = f"[{_cell(a['low'])}, {_cell(a['high'])}]" if a["low"] is not None else ""
        table.add_row(
            escape(value),
            str(g["pairs"]),
            _cell(a["value"]),
            interval,
            _cell(g["ece"]),
            _cell(g["length_gap"]),
        )
    return table


def _default_output(kind: str, benchmark: str) -> Path:
    return Path(".alignflow") / "eval" / f"{kind}-{benchmark}"


def _finish(report: dict[str, Any], bench, model, output: Path | None, uri: str, track: bool) -> None:
    """Write the report files, log them to MLflow when asked, print where everything went."""
    from alignflow.evaluation.benchmark import write_benchmark_report
    from alignflow.registry.evaluations import log_benchmark_run

    for note in report.get("notes") or []:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", soft_wrap=True)
    out_dir = output or _default_output(report["kind"], bench.name)
    report["tracking"] = None
    paths = write_benchmark_report(report, out_dir)
    if track and model.registered:
        report["tracking"] = log_benchmark_run(uri, report, model, bench, paths)
        paths = write_benchmark_report(report, out_dir)
        console.print(
            f"logged: run {report['tracking']['run_id']} on {model.name} v{model.version} "
            f"(logged model {model.model_id or 'none'}) in {uri}",
            highlight=False,
            soft_wrap=True,
        )
    elif track:
        console.print("not logged: tracking needs a registered model (models:/NAME@ALIAS)", highlight=False)
    console.print(f"report: {paths['json']} and {paths['markdown']}", highlight=False, soft_wrap=True)


def _nothing_to_evaluate(report_stub: dict[str, Any], bench, output: Path | None, message: str) -> typer.Exit:
    """Every row bad (or none of the needed kind): the report still says why, exit 1."""
    from alignflow.evaluation.benchmark import benchmark_info, write_benchmark_report

    report = {
        **report_stub,
        "benchmark": benchmark_info(bench),
        "rows": bench.rows(0),
        "metrics": {},
        "error": message,
        "exit_code": EXIT_NOTHING_TO_EVALUATE,
    }
    out_dir = output or _default_output(report["kind"], bench.name)
    paths = write_benchmark_report(report, out_dir)
    _print_rows(report["rows"])
    console.print(f"report: {paths['json']}", highlight=False, soft_wrap=True)
    return _fail(EXIT_NOTHING_TO_EVALUATE, message)


@app.command(epilog=EXIT_HELP)
def reward(
    model: str = typer.Option(..., "--model", help=MODEL_HELP),
    data: Path = typer.Option(..., "--data", help=DATA_HELP),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    subset_column: str = typer.Option(
        None, "--subset-column", help="report figures per value of this column"
    ),
    output: Path = typer.Option(None, "--output", help=OUTPUT_HELP),
    tracking_uri: str = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
    name: str = typer.Option(None, "--name", help=NAME_HELP),
    max_rows: int = typer.Option(None, "--max-rows", min=1, metavar="N", help=MAX_ROWS_HELP),
    fmt: str = typer.Option(None, "--format", help="reader: jsonl, json, parquet, csv, tsv, datasets"),
    config_path: Path = typer.Option(
        None, "--config", help="pipeline config YAML (data section) [default: the built-in demo config]"
    ),
    batch_size: int = typer.Option(
        32, "--batch-size", min=1, metavar="N", help="pairs scored per forward pass"
    ),
) -> None:
    """Score every valid pair of a file with a reward model.

    Scored responses (prompt/response/score, on data.score_range) are paired per prompt,
    the higher score chosen, and the report adds the rank correlation of reward with score.

    Reports accuracy with its 95% interval, ECE, mean margin, length bias (accuracy when
    the chosen answer is longer vs shorter, their gap, and the Spearman correlation of
    reward with length in characters), and per subset with --subset-column.
    """
    import tempfile

    from alignflow.logs import quiet_environment

    quiet_environment()
    cfg = _config(config_path, overrides)
    uri, track = _tracking(cfg, tracking_uri)
    bench = _read(data, cfg, max_rows, fmt, name)
    if not bench.pairs():
        raise _nothing_to_evaluate(
            {"kind": "reward", "model": {"ref": model}},
            bench,
            output,
            f"{data}: no valid pair rows to score (prompt/chosen/rejected, or two scored responses "
            "to one prompt)",
        )
    from alignflow.evaluation.benchmark import evaluate_reward_benchmark
    from alignflow.models.reward_scorer import load_reward_scorer

    with _failures_exit_3(), tempfile.TemporaryDirectory(prefix="alignflow-eval-") as work:
        resolved = _resolve(model, uri, work)
        scorer = _load(load_reward_scorer, resolved.path, normalize=False, batch_size=batch_size)
        report = evaluate_reward_benchmark(scorer, bench, subset_column)
        report |= {"model": resolved.as_dict(), "exit_code": EXIT_OK}
        _print_rows(report["rows"])
        console.print(_metrics_table(f"{bench.name}: reward model {model}", report["metrics"]))
        if report["subsets"]:
            console.print(_subsets_table(report["subsets"]))
        _finish(report, bench, resolved, output, uri, track)


def _judges(names: list[str], scorer, tie_margin: float) -> dict[str, Any]:
    from alignflow.evaluation.benchmark import answer_score
    from alignflow.evaluation.judges import AnswerJudge, RewardModelJudge

    judges: dict[str, Any] = {}
    for name in names:
        if name == "answer":
            judges["answer"] = AnswerJudge(answer_score)
        elif name == "reward":
            if scorer is None:
                raise _fail(EXIT_USAGE, "--judge reward needs --reward-model")
            judges["reward"] = RewardModelJudge(scorer, tie_margin)
        else:
            raise _fail(EXIT_USAGE, f"unknown judge {name!r}: choose answer or reward")
    return judges


@app.command(epilog=EXIT_HELP)
def policy(
    model: str = typer.Option(..., "--model", help=MODEL_HELP),
    data: Path = typer.Option(..., "--data", help="prompt file (prompt-only rows, pairs, ...): " + DATA_HELP),
    against: str = typer.Option(None, "--against", help="opponent for win rates and KL: " + MODEL_HELP),
    judge: list[str] = typer.Option(
        None, "--judge", help="answer and/or reward (default: answer, plus reward with --reward-model)"
    ),
    reward_model: str = typer.Option(None, "--reward-model", help="reward model for the reward judge"),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help=SET_HELP + "; evaluation.max_new_tokens=32"
    ),
    output: Path = typer.Option(None, "--output", help=OUTPUT_HELP),
    tracking_uri: str = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
    name: str = typer.Option(None, "--name", help=NAME_HELP),
    max_rows: int = typer.Option(None, "--max-rows", min=1, metavar="N", help=MAX_ROWS_HELP),
    fmt: str = typer.Option(None, "--format", help="reader: jsonl, json, parquet, csv, tsv, datasets"),
    config_path: Path = typer.Option(
        None, "--config", help="pipeline config YAML (data, evaluation) [default: the built-in demo config]"
    ),
) -> None:
    """Answer every distinct prompt of a file with a policy (and the --against model).

    Reports task accuracy where rows carry metadata answers, win rates vs --against per
    judge, all with 95% intervals, mean length (characters), the reward model's mean
    reward and, when both models share a vocabulary, KL(policy || against).
    """
    import tempfile

    from alignflow.logs import quiet_environment

    quiet_environment()
    cfg = _config(config_path, overrides)
    uri, track = _tracking(cfg, tracking_uri)
    bench = _read(data, cfg, max_rows, fmt, name)
    if not any(record.get("prompt") is not None for record in bench.records):
        raise _nothing_to_evaluate(
            {"kind": "policy", "model": {"ref": model}}, bench, output, f"{data}: no valid rows with a prompt"
        )
    from alignflow.evaluation.benchmark import PolicyRun, evaluate_policy_benchmark
    from alignflow.models import load_causal_lm
    from alignflow.models.reward_scorer import load_reward_scorer

    with _failures_exit_3(), tempfile.TemporaryDirectory(prefix="alignflow-eval-") as work:
        resolved = _resolve(model, uri, work)
        opponent = _resolve(against, uri, work) if against else None
        judge_model = _resolve(reward_model, uri, work) if reward_model else None
        scorer = _load(load_reward_scorer, judge_model.path, normalize=False) if judge_model else None
        names = judge or (["answer", "reward"] if scorer is not None else ["answer"])
        run = PolicyRun(
            policy=_load(load_causal_lm, resolved.path),
            against=_load(load_causal_lm, opponent.path) if opponent else None,
            judges=_judges(names, scorer, cfg.evaluation.tie_margin),
            scorer=scorer,
            config=cfg.evaluation,
        )
        report = evaluate_policy_benchmark(run, bench)
        report |= {
            "model": resolved.as_dict(),
            "against": opponent.as_dict() if opponent else None,
            "reward_model": judge_model.as_dict() if judge_model else None,
            "exit_code": EXIT_OK,
        }
        _print_rows(report["rows"])
        console.print(_metrics_table(f"{bench.name}: policy {model}", report["metrics"]))
        _finish(report, bench, resolved, output, uri, track)


@app.command("fit-judge", epilog=EXIT_HELP)
def fit_judge(
    data: Path = typer.Option(..., "--data", help=DATA_HELP),
    out: Path = typer.Option(..., "--out", help="the judge artefact to write (JSON)"),
    half: str = typer.Option(
        "all",
        "--half",
        help="fit on the prompts of one half only (policy or reward, split by the prompt's hash as "
        "policy.reward_data: disjoint splits a run), so the run's reward model never saw them",
    ),
    source: str = typer.Option(
        None, "--source", help="how the data is named in the artefact (default: the path)"
    ),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP),
    config_path: Path = typer.Option(None, "--config", help="pipeline config YAML (data section)"),
    max_rows: int = typer.Option(None, "--max-rows", min=1, metavar="N", help=MAX_ROWS_HELP),
) -> None:
    """Fit an outside judge once: frozen MiniLM embeddings and a linear preference head.

    Name the artefact in a config (evaluation.outside_judge) and every evaluation reports its
    win rates beside the run's own reward model's, and how often the two agree on the pinned
    pairs. It refuses a pinned set that shares a prompt with the pairs it was fitted on.
    """
    import hashlib

    from alignflow.data.halves import HALF_OF, rows_for
    from alignflow.evaluation.embedding_judge import fit_judge as fit
    from alignflow.logs import quiet_environment

    quiet_environment()
    if half not in ("all", *HALF_OF):
        raise _fail(EXIT_USAGE, f"--half {half!r}: choose all, policy or reward")
    cfg = _config(config_path, overrides)
    bench = _read(data, cfg, max_rows, None, None)
    pairs = bench.pairs() if half == "all" else rows_for(bench.pairs(), "disjoint", half)  # type: ignore[arg-type]
    if len(pairs) < 20:
        raise _fail(
            EXIT_NOTHING_TO_EVALUATE, f"{data}: {len(pairs)} pairs in half {half!r}; a judge needs 20"
        )
    digest = hashlib.sha256(data.read_bytes()).hexdigest() if data.is_file() else None
    trained_on = {"source": source or str(data), "sha256": digest, "half": half}
    with _failures_exit_3():
        artefact = fit(pairs, trained_on)
        artefact.save(out)
    fitted = artefact.fit
    console.print(
        f"fitted on {len(pairs)} pairs ({len(artefact.prompt_hashes)} prompts); cross-validated pair "
        f"accuracy {fitted['cv_pair_accuracy']:.3f} (C={fitted['C']:g}); wrote {out}",
        highlight=False,
        soft_wrap=True,
    )
