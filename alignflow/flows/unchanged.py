"""Recognising a run with nothing to do: same data version and config as the champion's.

The check needs only the data history and the registry, no Prefect API and no torch, so
``alignflow run`` makes it before starting Prefect and an unchanged nightly run costs
seconds. The flow makes the same check after its data stage (scheduled runs on a server).
Either way the stage rows of the run that trained the champion are reported as cache
hits, and the outcome is recorded as a parent MLflow run tagged ``nothing_to_do``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.config import PipelineConfig
from alignflow.flows.summary import RunSummary, StageOutcome
from alignflow.plan import RunPlan
from alignflow.registry.lineage import champion_version, pipeline_summary, run_finished, trained_on

if TYPE_CHECKING:  # mlflow is imported only when the check runs
    from mlflow.entities.model_registry import ModelVersion

OUTCOME_TAG = "pipeline.outcome"


def champion_stages(tracking_uri: str, champion: ModelVersion) -> list[StageOutcome]:
    """The training stages of the run that produced ``champion``, as cache hits of this run."""
    earlier = pipeline_summary(tracking_uri, champion) or {}
    return [
        StageOutcome(
            name=stage["name"],
            seconds=0.0,
            compute_seconds=0.0,
            cached=True,
            metrics=stage.get("metrics", {}),
            output=stage.get("output", {}),
            run_id=stage.get("run_id"),
        )
        for stage in earlier.get("stages", [])
        if stage["name"] != "data"
    ]


def mark_nothing_to_do(summary: RunSummary, tracking_uri: str, champion: ModelVersion) -> None:
    """Fill ``summary`` for a run that ends early: the champion's stages count as cache hits."""
    summary.stages.extend(champion_stages(tracking_uri, champion))
    summary.nothing_to_do = (
        f"champion version {champion.version} was trained on this data version "
        f"({(summary.data_version or '')[:12]}) and config ({summary.config_hash})"
    )


def check_before_flow(config: PipelineConfig, repo_dir: str | Path = ".") -> RunSummary | None:
    """The finished summary of an unchanged run, recorded in MLflow; None when there is work to do.

    Only a data snapshot already tracked for exactly these inputs counts (no validation
    happens here), so any new or changed input goes to the flow as usual.
    """
    from alignflow.data.pipeline import find_tracked_version

    started = time.perf_counter()
    plan = RunPlan(config, repo_dir)
    uri = config.tracking.resolved_uri()
    champion = champion_version(uri, config.project)  # first: it also opens the store the flow will use
    if champion is None:
        return None
    data_started = time.perf_counter()
    tracked = find_tracked_version(plan.data_source(repo_dir), config.data, repo_dir)
    if tracked is None or not trained_on(champion, tracked.version, plan.config_hash):
        return None
    if not run_finished(uri, champion):  # a killed run's rerun: the flow finishes its job
        return None
    summary = RunSummary(
        project=config.project, data_version=tracked.version, config_hash=plan.config_hash, tracking_uri=uri
    )
    summary.add(
        StageOutcome(
            name="data",
            seconds=time.perf_counter() - data_started,
            compute_seconds=0.0,
            cached=True,
            metrics={f"data/{k}": float(v) for k, v in tracked.counts.items()},
            output={"output_dir": tracked.data_dir},
        )
    )
    mark_nothing_to_do(summary, uri, champion)
    record_nothing_to_do(summary, config, repo_dir, started)
    return summary


def show_champion_stages(summary: RunSummary) -> None:
    """The champion's stages, reported as this run's cache hits, as child runs of its parent."""
    from alignflow.flows.parent_run import show_cache_hit

    for stage in summary.stages:
        show_cache_hit(summary, stage)


def record_nothing_to_do(
    summary: RunSummary, config: PipelineConfig, repo_dir: str | Path, started: float
) -> None:
    """One parent run per pipeline run, also when it had nothing to do (the schedule's audit trail)."""
    import mlflow

    from alignflow.flows.parent_run import parent_run, record_data_version, record_results

    outcome = {OUTCOME_TAG: "nothing_to_do"}
    with parent_run(config, repo_dir, summary.data_version, outcome) as run:
        summary.parent_run_id = run.info.run_id
        data = summary.stage("data")
        if data is not None and summary.data_version:
            record_data_version(config, run.info.run_id, summary.data_version, data.output["output_dir"])
        show_champion_stages(summary)
        record_results(summary)
        summary.wall_seconds = time.perf_counter() - started
        mlflow.log_metric("pipeline/wall_seconds", summary.wall_seconds)
        mlflow.log_dict(summary.to_dict(), "summary.json")
