"""A promotion decision written for people: the version page's description and the promote
run's gate table.

The registry's tags keep every figure for scripts (``promotion.gates``); someone opening a
version in the MLflow UI reads its description instead: the decision in one sentence, the
gate table, the judges that counted, the data and pinned set it was judged on and the
pipeline run that made it. The promote run keeps the same table as metrics (comparable
across runs) and as markdown and JSON artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from alignflow.evaluation.metric_names import gate_key, promoted_key
from alignflow.registry import tracking

if TYPE_CHECKING:  # promotion imports this module
    from alignflow.promotion.gates import GateResult, PromotionDecision

MAX_DESCRIPTION = 5000  # MLflow's limit on a model version's description
GATE_ARTIFACT = "promotion/{role}-gates"  # .md and .json on the promote run
TABLE_HEADER = "| gate | value | 95% interval | n | needed bound | outcome |"


@dataclass(frozen=True)
class JudgedOn:
    """What a decision was made on and by: read from the version's tags and its run."""

    data_version: str | None = None
    golden_version: str | None = None
    pipeline_run_id: str | None = None
    experiment_id: str | None = None
    answers: int = 0  # pinned prompts with a verifiable answer
    # why the data version holds pairs no judge could judge (``data add --accept-unjudged``)
    accepted_unjudged: str | None = None
    # a policy's RL stage against the model it started from, in one line (evaluation.rl_stage)
    rl_stage: str | None = None
    # what the pipeline run cost and, for a policy, each +0.01 of its gain (evaluation.cost)
    cost: str | None = None
    # the judge fitted outside every run, in one line (evaluation.outside_judge): reported only
    outside_judge: str | None = None
    # which step of the policy stage was handed on (its best held-out step), where it chose one
    handed_on: str | None = None


def _number(value: float | None, digits: str = ".4g") -> str:
    return "" if value is None else format(value, digits)


def _champion_said(previous: str | None, version: str) -> str:
    if previous is None:
        return "the first champion"
    return "already the champion" if previous == version else f"replacing version {previous}"


def decision_entry(decision: PromotionDecision) -> dict[str, Any]:
    """A decision as the run summary keeps it: outcome, reason, failed gates, judges, every gate.

    The record every account of a run reads (console, run log, Prefect summary, version page):
    each states a model's outcome through :func:`outcome_statement`, so they cannot disagree.
    """
    return {
        "name": decision.name,
        "version": decision.version,
        "promoted": decision.promoted,
        "reason": decision.reason,
        "failed": [r.name for r in decision.failed],
        "judges": decision.judges_counted,  # as the version's page lists them: answers first
        "gates": [{"name": r.name, "outcome": r.outcome, "describe": r.describe()} for r in decision.results],
    }


def reused_entry(name: str, version: str, produced_by_run: str, champion: bool) -> dict[str, Any]:
    """A reused version's record (a cache hit): decided by the run that produced it, not again;
    ``promoted`` while it holds ``champion`` (a reused champion reward model stays a trusted judge)."""
    entry: dict[str, Any] = {
        "name": name,
        "version": version,
        "promoted": champion,
        "reused": True,
        "produced_by_run": produced_by_run,
    }
    return entry | {"reason": outcome_statement(entry), "failed": [], "judges": [], "gates": []}


def outcome_statement(entry: Mapping[str, Any]) -> str:
    """What became of one model in a run, from its record: promoted, rejected (naming the failed
    gates), or reused and whether it stays champion. The one wording of a model's outcome."""
    if entry.get("reused"):
        held = "stays champion" if entry["promoted"] else "is not the champion"
        return f"reused, unchanged (decided by run {entry['produced_by_run']}); it {held}"
    if entry["promoted"]:
        return "promoted to champion"
    return f"not promoted (failed: {', '.join(entry.get('failed') or []) or 'no gates'})"


def decision_sentence(decision: PromotionDecision) -> str:
    """The decision in one sentence: its outcome statement, then what decided it."""
    said = outcome_statement(decision_entry(decision))
    said = said[0].upper() + said[1:]
    if decision.promoted:
        passed = f"all {len(decision.results)} gates passed" if decision.results else "no gates configured"
        return f"{said}: {passed}, {_champion_said(decision.previous_champion, decision.version)}."
    stays = f"version {decision.previous_champion}" if decision.previous_champion else "unset"
    return f"{said}: {len(decision.failed)} of {len(decision.results)} gates failed; champion stays {stays}."


def gate_row(result: GateResult) -> dict[str, Any]:
    """One gate as a row: the value, its 95% interval and n, the bound it needed, the outcome."""
    return {
        "gate": result.name,
        "value": result.value,
        "low": result.low,
        "high": result.high,
        "n": result.n,
        "needs": result.needs,
        "outcome": result.outcome,
        **({"detail": result.detail} if result.detail else {}),
    }


def gate_rows(decision: PromotionDecision) -> list[dict[str, Any]]:
    return [gate_row(r) for r in decision.results]


def _markdown_row(result: GateResult) -> str:
    outcome = result.outcome if result.passed else f"**{result.outcome}**"
    n = _number(result.n, "d")
    cells = (result.name, _number(result.value), result.interval(), n, result.needs, outcome)
    return "| " + " | ".join(cells) + " |"


def gate_table_markdown(decision: PromotionDecision) -> str:
    """The gate table in markdown (no rows: says that no gates were configured)."""
    if not decision.results:
        return "No gates configured."
    lines = [TABLE_HEADER, "|---|---|---|---|---|---|", *(_markdown_row(r) for r in decision.results)]
    return "\n".join(lines)


def judges_line(decision: PromotionDecision, answers: int) -> str:
    """The judges whose verdicts counted: verifiable answers first, then the preference judges."""
    return ", ".join(replace(decision, answers=answers).judges_counted) or "none"


def _run_link(run_id: str | None, experiment_id: str | None) -> str:
    if not run_id:
        return "none (registered outside a pipeline run)"
    if not experiment_id:
        return f"`{run_id}`"
    return f"[`{run_id}`](#/experiments/{experiment_id}/runs/{run_id})"


def version_description(decision: PromotionDecision, judged_on: JudgedOn) -> str:
    """The version page's description: sentence, gate table, what the RL stage added, what the
    run cost, judges, versions, pipeline run."""
    lines = [
        f"**{decision_sentence(decision)}**",
        "",
        gate_table_markdown(decision),
        "",
        *(f"- `{r.name}`: {r.detail}" for r in decision.results if r.detail),  # the slice that broke
        *([f"- {judged_on.rl_stage}"] if judged_on.rl_stage else []),
        *([f"- {judged_on.handed_on}"] if judged_on.handed_on else []),
        *([f"- {judged_on.cost}"] if judged_on.cost else []),
        f"- Judges that counted: {judges_line(decision, judged_on.answers)}",
        *([f"- {judged_on.outside_judge}"] if judged_on.outside_judge else []),
        f"- Data version (DVC md5): `{judged_on.data_version or 'unknown'}`",
        *(
            [f"- Trained on pairs no judge could judge, accepted: {judged_on.accepted_unjudged}"]
            if judged_on.accepted_unjudged
            else []
        ),
        f"- Pinned evaluation set: `{judged_on.golden_version or 'unknown'}`",
        f"- Pipeline run: {_run_link(judged_on.pipeline_run_id, judged_on.experiment_id)}",
    ]
    return "\n".join(lines)[:MAX_DESCRIPTION]


def gate_metrics(role: str, decision: PromotionDecision) -> dict[str, float]:
    """The gate table as metrics of the promote run: value, bounds, n, threshold and 0/1 passed
    per gate (``promotion/<role>/<gate>/…``), and ``promoted/<role>``."""
    metrics: dict[str, float] = {promoted_key(role): float(decision.promoted)}
    for r in decision.results:
        figures: Mapping[str, float | None] = {
            "": r.value,
            "low": r.low,
            "high": r.high,
            "n": r.n,
            "threshold": r.threshold,
            "passed": float(r.passed),
        }
        metrics |= {gate_key(role, r.name, part): float(v) for part, v in figures.items() if v is not None}
    return metrics


def log_decision(role: str, decision: PromotionDecision) -> None:
    """The gate table on the active run (the promote run) as metrics and as markdown and JSON
    artifacts; a no-op without an active run."""
    if not tracking.active():
        return
    import mlflow

    tracking.log_metrics(gate_metrics(role, decision))
    path = GATE_ARTIFACT.format(role=role)
    heading = f"# {decision.name} version {decision.version}\n\n{decision_sentence(decision)}\n\n"
    mlflow.log_text(heading + gate_table_markdown(decision) + "\n", f"{path}.md")
    mlflow.log_dict(decision_record(decision), f"{path}.json")


def decision_record(decision: PromotionDecision) -> dict[str, Any]:
    """The decision and its gate table as JSON: what a script comparing promote runs reads."""
    return {
        "name": decision.name,
        "version": decision.version,
        "promoted": decision.promoted,
        "decision": decision_sentence(decision),
        "judges": list(decision.judges),
        "gates": gate_rows(decision),
    }
