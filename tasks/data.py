"""Prefect task for the data stage: validate, snapshot and version (one ``add_dataset`` call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tasks.retry import retry_transient
from tasks.stage_task import pipeline_config, run_in_stage


@task(name="version-data", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_transient)
def version_data(
    config_json: dict, source: str, repo_dir: str = ".", parent_run_id: str | None = None
) -> dict[str, Any]:
    """Validate ``source``; when it passes, write the snapshot, ``dvc add`` and push it.

    Not cached by Prefect: ``add_dataset`` itself recognises an input it has already
    turned into the tracked snapshot (same bytes, data config and rules, snapshot intact)
    and returns that version with ``cached`` set, so a changed input is always validated.
    """
    config = pipeline_config(config_json)

    def call() -> dict[str, Any]:
        from alignflow.data.pipeline import add_dataset

        result = add_dataset(source, config.data, repo_dir=repo_dir)
        return {
            "version": result.version,
            "data_dir": str(Path(result.data_dir).resolve()),
            "metrics": {f"data/{k}": float(v) for k, v in result.counts.items()},
            "report_path": result.report_path,
            "manifest_path": result.manifest_path,
            "summary": result.validation.summary,
            "cached": result.reused,
        }

    return run_in_stage("data", config, parent_run_id, call)
