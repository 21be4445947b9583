"""What a retraining run leaves in the UIs, so they answer "what did last night's run do".

- Prefect (on the flow run): a markdown summary (outcome, stages with times and cache
  hits, every gate with its interval and n, the promotion decision) and a table of the
  stages. Keys are per project (``<project>-retrain-summary``, ``…-retrain-stages``), so
  the Artifacts page keeps one history per project, the newest on top.
- MLflow: the gate table (``eval/gates.json``, an ``mlflow.log_table`` artifact) on the
  run's evaluate run (the cache-hit run standing for it when the evaluation came from the
  cache; the promote run when there is neither), the training stages' learning curves
  (``plots/learning_curves.png``) and the command's log file (``logs/``) on the parent run.

Publishing never fails a finished run: a problem is logged and the run's result stands.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from alignflow.flows.summary import RunSummary, key_metrics
from alignflow.registry.decision_card import outcome_statement

logger = logging.getLogger(__name__)

GATES_TABLE = "eval/gates.json"
GATE_COLUMNS = ("model", "version", "gate", "outcome", "value", "low", "high", "n", "needs", "promoted")


def artifact_key(project: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) for ``project``."""
    slug = re.sub(r"[^a-z0-9]+", "-", project.lower()).strip("-") or "alignflow"
    return f"{slug}-{what}"


def _structured_gates(tracking_uri: str | None, decision: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Each gate's value, interval, n and threshold, as promotion recorded them on the version."""
    if not tracking_uri:
        return None
    from mlflow import MlflowClient

    from alignflow.registry.promotion import GATES_TAG

    tags = MlflowClient(tracking_uri).get_model_version(decision["name"], str(decision["version"])).tags
    try:
        return json.loads(tags[GATES_TAG])
    except (KeyError, ValueError):  # an older version, or a list cut at the tag length limit
        return None


def gate_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per gate of every promotion decision of the run."""
    from alignflow.promotion.gates import BOUND_NAMES

    rows = []
    for decision in summary.get("promotions", {}).values():
        model = {"model": decision["name"], "version": str(decision["version"])}
        promoted = bool(decision["promoted"])
        try:
            structured = _structured_gates(summary.get("tracking_uri"), decision)
        except Exception:  # the registry is not reachable: the descriptions still say it all
            logger.debug("gate details not read for %s", decision["name"], exc_info=True)
            structured = None
        if structured is None:
            for gate in decision.get("gates", []):
                rows.append(
                    {**model, "gate": gate["name"], "outcome": gate["outcome"], "value": None, "low": None}
                    | {"high": None, "n": None, "needs": gate["describe"], "promoted": promoted}
                )
            continue
        for gate in structured:
            needs = f"{BOUND_NAMES.get(gate['bound'], gate['bound'])} {gate['op']} {gate['threshold']:g}"
            rows.append(
                {**model, "gate": gate["name"], "outcome": gate["outcome"]}
                | {k: gate.get(k) for k in ("value", "low", "high", "n")}
                | {"needs": needs, "promoted": promoted}
            )
    return rows


def stage_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "stage": stage["name"],
            "seconds": round(stage["seconds"], 1),
            "cache": "hit" if stage["cached"] else "ran",
            "compute_seconds": round(stage["compute_seconds"], 1),
            "key_metrics": key_metrics(stage["name"], stage["metrics"]),
        }
        for stage in summary["stages"]
    ]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def outcome_line(summary: dict[str, Any]) -> str:
    """The run's outcome in one sentence."""
    if summary.get("stopped"):
        return f"stopped before training: {summary['stopped']['message']}"
    if summary.get("nothing_to_do"):
        return f"nothing to do: {summary['nothing_to_do']}"
    decisions = summary.get("promotions", {}).values()
    if not decisions:
        return "no promotion decision"
    return "; ".join(f"{d['name']} v{d['version']} {outcome_statement(d)}" for d in decisions)


def summary_markdown(summary: dict[str, Any], gates: list[dict[str, Any]]) -> str:
    """The Prefect summary of one run: outcome, lineage, stages, gates."""
    stages = summary["stages"]
    hits = sum(1 for s in stages if s["cached"])
    lines = [f"# retrain: {summary['project']}", "", f"**Outcome:** {_cell(outcome_line(summary))}", ""]
    lines.append(f"- data version (DVC md5): `{summary.get('data_version') or 'none'}`")
    if summary.get("golden"):
        golden = summary["golden"]
        lines.append(
            f"- pinned evaluation set: `{golden['version']}` ({golden['prompts']} prompts, "
            f"{golden['answers']} with answers, {golden['pairs']} pairs)"
        )
    if summary.get("rl_stage"):
        lines.append(f"- {_cell(summary['rl_stage'])}")
    lines.append(f"- config hash: `{summary.get('config_hash') or ''}`")
    parent, uri = summary.get("parent_run_id") or "", summary.get("tracking_uri") or ""
    lines.append(f"- MLflow parent run: `{parent}` on `{uri}`")
    lines.append(
        f"- wall {summary['wall_seconds']:.1f} s, stage compute {summary['compute_seconds']:.1f} s, "
        f"orchestration overhead {summary['orchestration_overhead']:.1%}, cache hits {hits} of {len(stages)}"
    )
    if summary.get("startup_seconds"):
        startup = summary["startup_seconds"]
        lines.append(f"- before the flow: {startup:.1f} s (loading, Prefect's API, the flow run starting)")
    if stages:
        lines += ["", "## Stages", "", "| stage | time (s) | cache | key metrics |", "|---|---|---|---|"]
        lines += [
            f"| {r['stage']} | {r['seconds']:.1f} | {r['cache']} | {_cell(r['key_metrics'])} |"
            for r in stage_rows(summary)
        ]
    for decision in summary.get("promotions", {}).values():
        said = _cell(outcome_statement(decision))
        lines += ["", f"## {decision['name']} v{decision['version']}: {said}", ""]
        if decision.get("judges"):
            lines += [f"Judges that counted: {', '.join(decision['judges'])}", ""]
        version = str(decision["version"])
        ours = [g for g in gates if g["model"] == decision["name"] and g["version"] == version]
        if not ours:
            lines.append("No gates configured.")
            continue
        lines += ["| gate | outcome | value | 95% interval | n | needs |", "|---|---|---|---|---|---|"]
        for gate in ours:
            interval = f"[{_cell(gate['low'])}, {_cell(gate['high'])}]" if gate["low"] is not None else ""
            lines.append(
                f"| {gate['gate']} | {gate['outcome']} | {_cell(gate['value'])} | {interval} | "
                f"{_cell(gate['n'])} | {_cell(gate['needs'])} |"
            )
    return "\n".join(lines) + "\n"


def _stage_run_id(tracking_uri: str, parent_run_id: str, name: str) -> str | None:
    from alignflow.registry.runs import child_runs

    runs = [r for r in child_runs(tracking_uri, parent_run_id) if r.info.run_name == name]
    return runs[0].info.run_id if runs else None


def log_gate_table(summary: dict[str, Any], gates: list[dict[str, Any]]) -> str | None:
    """The gate table on this run's evaluate run (a cache hit's stand-in included), else its promote run."""
    uri, parent = summary.get("tracking_uri"), summary.get("parent_run_id")
    if not gates or not uri or not parent:
        return None
    from mlflow import MlflowClient

    run_id = _stage_run_id(uri, parent, "evaluate") or _stage_run_id(uri, parent, "promote")
    if run_id is None:
        return None
    columns = {c: [g.get(c) for g in gates] for c in GATE_COLUMNS}
    MlflowClient(uri).log_table(run_id, data=columns, artifact_file=GATES_TABLE)
    return run_id


def _publish_prefect(summary: dict[str, Any], gates: list[dict[str, Any]]) -> None:
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    project = summary["project"]
    create_markdown_artifact(
        markdown=summary_markdown(summary, gates),
        key=artifact_key(project, "retrain-summary"),
        description=outcome_line(summary)[:500],
    )
    if summary["stages"]:
        create_table_artifact(
            table=stage_rows(summary),
            key=artifact_key(project, "retrain-stages"),
            description=f"stages of MLflow run {summary.get('parent_run_id')}",
        )


def _log_file_to_parent(summary: dict[str, Any]) -> None:
    from alignflow.logs import current_log_file

    path = current_log_file()
    if path is None or not path.exists() or not summary.get("parent_run_id"):
        return
    from mlflow import MlflowClient

    MlflowClient(summary["tracking_uri"]).log_artifact(summary["parent_run_id"], str(path), "logs")


TRAINING_STAGES = ("sft", "reward", "policy")
LEARNING_CURVES = "learning_curves.png"


def log_learning_curves(summary: dict[str, Any]) -> str | None:
    """The training stages' learning curves as one PNG (``plots/learning_curves.png``) on the
    parent run; a stage reused from the cache draws the curves of the run that trained it."""
    uri, parent = summary.get("tracking_uri"), summary.get("parent_run_id")
    run_ids = {
        s["name"]: s["run_id"]
        for s in summary.get("stages", [])
        if s["name"] in TRAINING_STAGES and s.get("run_id")
    }
    if not uri or not parent or not run_ids:
        return None
    import tempfile
    from pathlib import Path

    from mlflow import MlflowClient

    from alignflow.evaluation.plots import plot_learning_curves

    with tempfile.TemporaryDirectory() as tmp:
        path = plot_learning_curves(uri, run_ids, Path(tmp) / LEARNING_CURVES)
        if path is None:
            return None
        MlflowClient(uri).log_artifact(parent, str(path), "plots")
    return f"plots/{LEARNING_CURVES}"


def publish_run_artifacts(summary: RunSummary | dict[str, Any]) -> None:
    """Prefect's summary and stage table, the gate table and the log file in MLflow."""
    data = summary.to_dict() if isinstance(summary, RunSummary) else summary
    gates = gate_rows(data)
    for what, publish in (
        ("Prefect artifacts", lambda: _publish_prefect(data, gates)),
        ("MLflow gate table", lambda: log_gate_table(data, gates)),
        ("learning curves", lambda: log_learning_curves(data)),
        ("log file", lambda: _log_file_to_parent(data)),
    ):
        try:
            publish()
        except Exception as error:  # the run is done: its record must not undo it
            logger.warning("could not publish the %s of this run: %s", what, error)
