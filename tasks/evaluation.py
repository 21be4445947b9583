"""Prefect task for the evaluation stage: one ``alignflow.evaluation.evaluate_paths`` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tasks.caching import stage_cache_key
from tasks.retry import retry_transient
from tasks.stage_task import pipeline_config, run_in_stage


@task(
    name="evaluate",
    cache_key_fn=stage_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_transient,
)
def evaluate(
    config_json: dict,
    data_dir: str,
    output_dir: str,
    data_version: str,
    config_hash: str,
    policy_dir: str,
    reference_dir: str,
    reward_dir: str,
    champion_dir: str | None = None,
    upstream: str = "",
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Evaluate the reward model and the policy (vs reference and champion); write and log the report."""
    config = pipeline_config(config_json)

    def call() -> dict[str, Any]:
        from alignflow.evaluation.evaluate import evaluate_paths
        from alignflow.evaluation.plots import report_plots
        from alignflow.evaluation.report import log_report

        report = evaluate_paths(
            data_dir, policy_dir, reference_dir, reward_dir, champion_dir, config.evaluation
        )
        report.info.update({"data_version": data_version, "champion_compared": champion_dir is not None})
        plots = report_plots(report, Path(output_dir) / "plots")
        paths = log_report(report, output_dir, plots)
        return {"metrics": report.gate_metrics(), "report": str(paths["json"]), "output_dir": output_dir}

    return run_in_stage("evaluate", config, parent_run_id, call)
