"""The parent MLflow run of one pipeline run, as people compare runs in the MLflow UI.

Both ways a pipeline run is recorded (the retrain flow, and ``alignflow run`` finding
nothing to do before Prefect starts) open it here, so every parent reads the same: named
``<project>-<algorithm>-<short data version>``, the resolved config as params, the data
version as its dataset input, the headline results as metrics, and a child run for each
stage the cache answered, pointing at the run that did the work.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow.entities import Run

from alignflow.config import PipelineConfig, config_hash
from alignflow.flows.summary import RunSummary, StageOutcome
from alignflow.registry.pipeline_record import (
    PIPELINE_TAG,
    cache_hit_run,
    log_config,
    log_data_version,
    log_headline_metrics,
    rename_run,
    run_name,
)
from alignflow.registry.runs import CONFIG_HASH_TAG, lineage_tags, pipeline_run

FLOW_NAME = "retrain"


@contextmanager
def parent_run(
    config: PipelineConfig,
    repo_dir: str | Path,
    data_version: str | None = None,
    tags: Mapping[str, Any] | None = None,
) -> Iterator[Run]:
    """Start (and make active) the parent run: its name, lineage tags and config params. The
    run of the same config that a killed process left RUNNING is continued instead."""
    lineage = lineage_tags(data_version, config_hash(config), repo_dir)
    with pipeline_run(
        config.tracking.resolved_uri(),
        config.tracking.experiment or config.project,
        run_name=run_name(config.project, config.policy.algorithm, data_version),
        tags={**config.tracking.tags, **lineage, PIPELINE_TAG: FLOW_NAME, **(tags or {})},
        artifact_location=config.tracking.artifact_location,
        continue_killed={CONFIG_HASH_TAG: lineage[CONFIG_HASH_TAG], PIPELINE_TAG: FLOW_NAME},
    ) as run:
        log_config(config)
        yield run


def record_data_version(config: PipelineConfig, run_id: str, data_version: str, data_dir: str | Path) -> None:
    """Name the active parent run after its data version and log that data as its input."""
    name = run_name(config.project, config.policy.algorithm, data_version)
    rename_run(config.tracking.resolved_uri(), run_id, name)
    log_data_version(data_dir, data_version)


def show_cache_hit(summary: RunSummary, stage: StageOutcome) -> None:
    """A stage the cache answered, as a child run of this parent pointing at its producer."""
    if stage.cached and stage.run_id and summary.tracking_uri and summary.parent_run_id:
        cache_hit_run(summary.tracking_uri, summary.parent_run_id, stage.name, stage.run_id, stage.metrics)


def record_results(summary: RunSummary) -> None:
    """The headline results on the active parent run: the evaluation's figures (this run's,
    or the champion's when nothing was retrained) and ``promoted/<role>``."""
    evaluation = summary.stage("evaluate")
    promoted = {role: bool(decision.get("promoted")) for role, decision in summary.promotions.items()}
    log_headline_metrics(evaluation.metrics if evaluation else {}, promoted)
