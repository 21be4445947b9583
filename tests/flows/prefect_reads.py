"""Reading back what a flow run left in the Prefect API, as its UI pages show it."""

from __future__ import annotations

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort, LogSort


def run_logs(flow_run_id: str) -> list[tuple[str, int, str]]:
    """``(logger, level, message)`` of the flow run's log records, oldest first (its Logs tab)."""
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
            sort=LogSort.TIMESTAMP_ASC,
            limit=200,  # the most the API returns at once
            offset=0,
        )
    return [(log.name, log.level, log.message) for log in logs]


def read_flow_run(flow_run_id: str) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def flow_runs_named(*names: str) -> list[FlowRun]:
    """Every flow run with one of ``names`` (explicit sort and limit: the API refuses nulls)."""
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=list(names))),
            sort=FlowRunSort.START_TIME_DESC,
            limit=200,
        )
