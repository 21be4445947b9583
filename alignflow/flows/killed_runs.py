"""Flow and task runs whose process was killed, marked Crashed by the next run on the host.

A SIGKILLed process (a CLI run, or the flow-run process of a worker such as ``alignflow
serve``) never reports its end, so Prefect shows its runs Running for ever; only flow-run
heartbeats watched by a server automation would notice, and not at all on an ephemeral API.
Every retrain run tags itself and the subflows and tasks it starts with the process that runs
them (host, pid and start time: the MLflow runs' owner); the next retrain run on that host, and
``alignflow serve`` when it starts, mark the runs whose process is gone Crashed, saying which
process it was. A run on another host, or tagged by no process, is never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort, TaskRunSort
from prefect.states import Crashed

from alignflow.registry.runs import owner_gone, owner_tag

logger = logging.getLogger(__name__)

OWNER_LABEL = "alignflow.owner:"  # the tag's prefix; the rest is host:pid:start time
UNFINISHED = [StateType.RUNNING, StateType.PENDING]
READ_AT_ONCE = 200  # the most the API returns in one read


def owner_label() -> str:
    """The tag naming this process as the one running a flow or task run."""
    return OWNER_LABEL + owner_tag()


def run_owner(tags: Iterable[str] | None) -> str | None:
    """The owning process a run's tags name, if any."""
    return next((t[len(OWNER_LABEL) :] for t in tags or () if t.startswith(OWNER_LABEL)), None)


def killed(tags: Iterable[str] | None) -> bool:
    """Whether the run's tags name a process of this host that is gone."""
    owner = run_owner(tags)
    return owner is not None and owner_gone(owner)


def _crash_message(owner: str | None) -> str:
    host, pid, _ = (owner or "?:?:?").rsplit(":", 2)
    return f"its process ({host}, pid {pid}) was killed before the run ended; marked crashed by a later run"


def _unfinished_flow_runs(client: Any) -> list[Any]:
    return client.read_flow_runs(
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=UNFINISHED))),
        sort=FlowRunSort.START_TIME_DESC,
        limit=READ_AT_ONCE,
    )


def _unfinished_task_runs(client: Any) -> list[Any]:
    return client.read_task_runs(
        task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=UNFINISHED))),
        sort=TaskRunSort.EXPECTED_START_TIME_DESC,
        limit=READ_AT_ONCE,
    )


def mark_killed_runs_crashed() -> list[str]:
    """Mark Crashed every unfinished flow and task run whose owning process on this host is
    gone; a line for each flow run marked. Failures to read or write the API are logged, never
    raised: this is clean-up, and the new run's work matters more than the old runs' states."""
    marked: list[str] = []
    try:
        with get_client(sync_client=True) as client:
            for run in _unfinished_flow_runs(client):
                if killed(run.tags):
                    message = _crash_message(run_owner(run.tags))
                    client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                    marked.append(f"Prefect flow run {run.name!r} ({run.id}) crashed: {message}")
            for task_run in _unfinished_task_runs(client):
                if killed(task_run.tags):
                    message = _crash_message(run_owner(task_run.tags))
                    client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
    except Exception as error:
        logger.warning("could not mark killed Prefect runs crashed: %s", error)
    for line in marked:
        logger.warning(line)
    return marked
