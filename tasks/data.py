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

    Not cached by Prefect: DVC itself recognises unchanged content (same md5), and the
    check is what guarantees that training never starts on unvalidated data.
    """
    from alignflow.data.pipeline import add_dataset

    config = pipeline_config(config_json)

    def call() -> dict[str, Any]:
        result = add_dataset(source, config.data, repo_dir=repo_dir)
        return {
            "version": result.version,
            "data_dir": str(Path(result.data_dir).resolve()),
            "metrics": {f"data/{k}": float(v) for k, v in result.counts.items()},
            "report_path": result.report_path,
            "manifest_path": result.manifest_path,
            "summary": result.validation.summary,
        }

    return run_in_stage("data", config, parent_run_id, call)


@task(name="demo-data")
def write_demo_data(out_dir: str, data_config: dict) -> str:
    """Generate the built-in demo data set (deterministic) and return the file to version."""
    from alignflow.data.config import DataConfig
    from alignflow.data.demo import write_demo_dataset

    config = DataConfig.model_validate(data_config)
    paths = write_demo_dataset(
        out_dir,
        n_pairs=config.demo_rows,
        n_scored=config.demo_scored_rows,
        eval_fraction=config.eval_fraction,
    )
    return str(paths["demo"])
