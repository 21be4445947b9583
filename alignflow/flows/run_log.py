"""What a retraining run shows in the Prefect UI: our log lines, a name and tags.

Prefect's Logs tab lists the records that reached its API. The CLI keeps Prefect's own
loggers at WARNING (:mod:`alignflow.flows.environment`) and ours are not Prefect's, so a run used to
say "This run didn't generate logs". For the length of a flow run, :func:`logs_to_the_run`
hands the records of our loggers (``alignflow``, ``flows``, ``tasks``: each stage started
and finished with its key metrics, the gate decisions, the outcome, the library's
warnings) to Prefect's API log handler, which files each under the flow or task run it
was logged in. :func:`label_flow_run` names the run as its MLflow parent run is named and
adds tags (project, algorithm, data version, outcome) as they become known.

Labelling never fails a run: the API refusing a rename is logged, and the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from prefect.context import FlowRunContext, get_run_context
from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler

from alignflow.flows.summary import RunSummary
from alignflow.logs import OURS
from alignflow.registry.pipeline_record import SHORT_VERSION, run_name

logger = logging.getLogger(__name__)


class _RunLogHandler(APILogHandler):
    """Prefect's API log handler, silent outside a run.

    A record from a thread that does not carry the run's context (a library's worker
    thread) has no run to be filed under; Prefect's own handler would warn about each.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "flow_run_id", None) or _in_a_run():
            super().emit(record)


def _in_a_run() -> bool:
    try:
        get_run_context()
    except MissingContextError:
        return False
    return True


@contextmanager
def _sent_to_api(name: str) -> Iterator[None]:
    """Logger ``name``'s info lines go to the run, unless Prefect already sends them
    (``PREFECT_LOGGING_EXTRA_LOGGERS``, or an outer flow run of this process)."""
    target = logging.getLogger(name)
    if any(isinstance(handler, APILogHandler) for handler in target.handlers):
        yield
        return
    handler, level = _RunLogHandler(), target.level
    target.addHandler(handler)
    if target.getEffectiveLevel() > logging.INFO:
        target.setLevel(logging.INFO)
    try:
        yield
    finally:
        target.removeHandler(handler)
        target.setLevel(level)
        handler.flush()  # the records are on the run before the flow returns


@contextmanager
def logs_to_the_run() -> Iterator[None]:
    """Our loggers' info lines and warnings reach the Prefect run they were logged in."""
    with ExitStack() as stack:
        for name in OURS:
            stack.enter_context(_sent_to_api(name))
        yield


def retrain_run_name() -> str:
    """The retrain flow run's name from its start: ``<project>-<algorithm>``, as the MLflow
    parent run is named before the data version joins it (``flow_run_name`` callable)."""
    from prefect.runtime import flow_run

    from alignflow.config import load_config

    parameters = flow_run.parameters
    try:
        config = load_config(parameters.get("config_path"), parameters.get("overrides") or [])
    except Exception:  # the flow's body reports a bad config; the name need not
        return "retrain"
    return run_name(config.project, config.policy.algorithm)


def tag(key: str, value: Any) -> str:
    """One ``key:value`` tag, as the Prefect UI's tag filter matches them."""
    return f"{key}:{value}"


def config_tags(project: str, algorithm: str) -> list[str]:
    return [tag("project", project), tag("algorithm", algorithm)]


def data_tag(data_version: str) -> str:
    return tag("data", data_version[:SHORT_VERSION])


ROLE_FATES = ("promoted", "rejected", "reused")


def role_outcome(decision: dict[str, Any]) -> str:
    """A model's fate in one word: promoted, rejected, or reused (a cache hit, decided earlier)."""
    if decision.get("reused"):
        return "reused"
    return "promoted" if decision.get("promoted") else "rejected"


def outcome_tags(summary: RunSummary) -> list[str]:
    """``outcome:<promoted|not_promoted|nothing_to_do|stopped>`` and ``<role>:<fate>``."""
    roles = [tag(role, role_outcome(d)) for role, d in sorted(summary.promotions.items())]
    return [tag("outcome", summary.outcome), *roles]


def label_flow_run(name: str | None = None, tags: Iterable[str] = ()) -> None:
    """Rename the current flow run and add ``tags`` to the ones it has (no-op outside a run)."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    run = context.flow_run
    merged = sorted({*(run.tags or []), *tags})
    try:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, name=name, tags=merged)
    except Exception as error:  # the run's work matters more than its label
        logger.warning("could not label Prefect flow run %s: %s", run.id, error)
        return
    run.tags = merged
    if name:
        run.name = name


def stage_line(stage: str, cached: bool, seconds: float, metrics: dict[str, Any]) -> str:
    """One finished stage, as the CLI's plain output says it: ``sft: done in 12.3s, loss=…``."""
    from alignflow.flows.summary import key_metrics

    shown = key_metrics(stage, metrics)
    said = f"{stage}: {'cache hit' if cached else 'done'} in {seconds:.1f}s"
    return f"{said}, {shown}" if shown else said


def log_decisions(summary: RunSummary) -> None:
    """What the RL stage added, each promotion decision with its gates, then the run's outcome,
    on the run's log."""
    from alignflow.flows.artifacts import outcome_line
    from alignflow.registry.decision_card import outcome_statement

    data = summary.to_dict()
    if summary.rl_stage:
        logger.info("%s", summary.rl_stage)
    for decision in data.get("promotions", {}).values():
        logger.info("%s v%s: %s", decision["name"], decision["version"], outcome_statement(decision))
        for gate in decision.get("gates", []):
            logger.info("  gate %s %s", gate["outcome"], gate["describe"])
    logger.info("outcome: %s", outcome_line(data))
