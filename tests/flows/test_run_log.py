"""What a run leaves in the Prefect UI, read back through the session's Prefect test API:
our log lines on the run, its name and tags, and ``alignflow serve``'s line per finished run.

The retrain flow's own lines and tags are checked on real runs in ``test_artifacts.py``
(the CLI) and ``test_retrain.py`` (a rejected challenger); these tests pin the parts.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from prefect import flow, get_client
from prefect.context import FlowRunContext
from prefect.states import Completed, Failed

from alignflow.cli.serve_runner import outcome_line, report_finished
from alignflow.flows.run_log import label_flow_run, logs_to_the_run, outcome_tags
from alignflow.flows.summary import RunSummary
from tests.flows.prefect_reads import read_flow_run, run_logs


@flow(name="narrated")
def narrated() -> str:
    """Logs as the retrain flow does, from our loggers, with the CLI's quiet levels."""
    with logs_to_the_run():
        logging.getLogger("alignflow.flows.retrain").info("sft: done in 1.0s, loss=0.5")
        logging.getLogger("alignflow.training").warning("the library warns")
        logging.getLogger("mlflow.tracking").info("not ours")
        label_flow_run("demo-dpo-2fa81c3", ["project:demo"])
        label_flow_run(tags=["outcome:promoted"])
    logging.getLogger("alignflow.flows.retrain").info("after the run's logging ended")
    return str(FlowRunContext.get().flow_run.id)


def test_our_log_lines_reach_the_flow_run_and_labels_add_up(caplog):
    ours = logging.getLogger("alignflow")
    ours.setLevel(logging.WARNING)  # as the CLI leaves it: info lines would be dropped
    try:
        flow_run_id = narrated()
    finally:
        ours.setLevel(logging.NOTSET)
    logs = run_logs(flow_run_id)
    assert ("alignflow.flows.retrain", logging.INFO, "sft: done in 1.0s, loss=0.5") in logs
    assert ("alignflow.training", logging.WARNING, "the library warns") in logs
    assert not [log for log in logs if log[0].startswith("mlflow") or "after the run" in log[2]], logs
    run = read_flow_run(flow_run_id)
    assert run.name == "demo-dpo-2fa81c3"
    assert {"project:demo", "outcome:promoted"} <= set(run.tags), "a later label keeps the earlier tags"
    assert ours.handlers == [], "the API handler is removed when the run's logging ends"


def test_outcome_tags_name_the_run_and_each_model():
    summary = RunSummary(project="demo")
    summary.promotions = {
        "policy": {"promoted": False},
        "reward": {"promoted": False, "reused": True},
    }
    assert outcome_tags(summary) == ["outcome:not_promoted", "policy:rejected", "reward:reused"]
    summary.promotions["policy"]["promoted"] = True
    assert outcome_tags(summary)[:2] == ["outcome:promoted", "policy:promoted"]
    summary.stopped = {"reason": "label_disagreement"}
    assert outcome_tags(summary)[0] == "outcome:stopped"


async def _deployment_with_runs(client, name: str) -> tuple:
    """A deployment with a completed retrain-like run, a failed one and one still scheduled."""
    flow_id = await client.create_flow_from_name(f"serve-{name}")
    deployment_id = await client.create_deployment(flow_id=flow_id, name=name)
    tags = ["project:demo", "outcome:not_promoted", "policy:rejected", "reward:reused"]
    done = await client.create_flow_run_from_deployment(deployment_id, name="demo-dpo-2fa81c3", tags=tags)
    failed = await client.create_flow_run_from_deployment(deployment_id, name="demo-dpo-0c1d2e3")
    waiting = await client.create_flow_run_from_deployment(deployment_id, name="demo-dpo-waiting")
    await client.set_flow_run_state(done.id, Completed(), force=True)
    await client.set_flow_run_state(failed.id, Failed(message="stage 'sft' failed\ntraceback"), force=True)
    return deployment_id, done, failed, waiting


def test_serve_reports_each_finished_run_once_with_its_outcome():
    lines: list[str] = []

    async def scenario() -> None:
        async with get_client() as client:
            deployment_id, done, failed, _ = await _deployment_with_runs(client, "nightly")
            served, seen = {deployment_id: "retrain/nightly"}, set()
            since = datetime.now(UTC) - timedelta(minutes=1)
            await report_finished(client, served, since, seen, lines.append)
            await report_finished(client, served, since, seen, lines.append)  # nothing new
            assert seen == {done.id, failed.id}

    asyncio.run(scenario())
    assert len(lines) == 2, lines
    by_name = {line.split("'")[1]: line for line in lines}
    assert by_name["demo-dpo-2fa81c3"].endswith(
        "] retrain/nightly run 'demo-dpo-2fa81c3': Completed: not_promoted (policy rejected, reward reused)"
    )
    assert by_name["demo-dpo-0c1d2e3"].endswith(": Failed: stage 'sft' failed"), "the state's message"


def test_a_completed_run_without_outcome_tags_is_one_line_with_its_state():
    from prefect.client.schemas.objects import FlowRun

    run = FlowRun(flow_id="00000000-0000-0000-0000-000000000000", name="ab-1", tags=[], state=Completed())
    assert outcome_line(run, "ab-check/agent") == "[-] ab-check/agent run 'ab-1': Completed"
