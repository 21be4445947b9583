"""The live A/B verdict on a schedule: promote an agent's challenger once people clearly prefer it.

A thin flow over :func:`alignflow.service.ab.human_verdict`, so the decision, its numbers
and the gate are the ones ``alignflow promote --human`` shows, tagged on the version.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from alignflow.config import load_config
from alignflow.service.ab import human_verdict


@flow(name="ab-check", log_prints=False)
def ab_check(
    agent_id: str,
    database_url: str,
    tracking_uri: str,
    config_path: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Judge the challenger on live ratings; returns the decision (or why there was none)."""
    config = load_config(config_path, [*(overrides or []), f"project={agent_id}"])
    logger = get_run_logger()
    try:
        decision = human_verdict(agent_id, database_url, tracking_uri, config.promotion)
    except LookupError as exc:
        logger.info("no A/B to judge: %s", exc)
        return {"agent_id": agent_id, "judged": False, "reason": str(exc)}
    logger.info("%s v%s: %s (%s)", decision.name, decision.version,
                "promoted" if decision.promoted else "kept as challenger", decision.reason)  # fmt: skip
    return {
        "agent_id": agent_id,
        "judged": True,
        "version": decision.version,
        "promoted": decision.promoted,
        "reason": decision.reason,
    }
