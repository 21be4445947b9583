"""Prefect task for the evaluation stage: one ``alignflow.evaluation.evaluate_paths`` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tasks.caching import stage_cache_key
from tasks.retry import retry_transient
from tasks.stage_inputs import EvaluateInputs
from tasks.stage_task import pipeline_config, run_in_stage


@task(
    name="evaluate",
    cache_key_fn=stage_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_transient,
)
def evaluate(inputs: EvaluateInputs) -> dict[str, Any]:
    """Evaluate the reward model and the policy (vs reference and champion); write and log the report."""
    config = pipeline_config(inputs.config_json)

    def call() -> dict[str, Any]:
        from alignflow.evaluation.evaluate import evaluate_paths
        from alignflow.evaluation.plots import report_plots
        from alignflow.evaluation.report import log_report

        report = evaluate_paths(
            inputs.data_dir,
            inputs.policy_dir,
            inputs.reference_dir,
            inputs.reward_dir,
            inputs.champion_dir,
            config.evaluation,
            golden_path=inputs.golden_path,
            champion_reward_dir=inputs.champion_reward_dir,
        )
        compared = inputs.champion_dir is not None
        report.info.update({"data_version": inputs.data_version, "champion_compared": compared})
        if inputs.golden_path:
            report.info["golden_path"] = inputs.golden_path
        out = inputs.output_dir
        paths = log_report(report, out, report_plots(report, Path(out) / "plots"))
        return {"metrics": report.gate_metrics(), "report": str(paths["json"]), "output_dir": out}

    return run_in_stage("evaluate", config, inputs.parent_run_id, call)
