"""Prefect task for the evaluation stage: one ``alignflow.evaluation.evaluate_paths`` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from alignflow import progress
from alignflow.tasks.caching import stage_cache_key
from alignflow.tasks.retry import retry_transient
from alignflow.tasks.stage_inputs import EvaluateInputs
from alignflow.tasks.stage_task import pipeline_config, run_in_stage

COMPLETIONS_TABLE = "eval/completions.json"
MODELS = ("policy", "reference", "rl_start", "champion")
SLICE_INFO = ("policy_slices", "reward_slices")


def _verdict(value: Any, against: str) -> str:
    """A judge's verdict on one prompt in words (1.0: the policy won, 0.0: the other side)."""
    if value is None:
        return ""
    return {1.0: "policy", 0.0: against, 0.5: "tie"}.get(float(value), f"{float(value):.2f}")


def completions_table(samples: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each evaluated prompt's completions of policy, reference and champion side by side,
    whether each gives the reference answer and whether it loops, and every judge's verdict: the columns
    ``mlflow.log_table`` takes (one row per pinned prompt, sortable in the UI)."""
    from alignflow.data.answers import task_accuracy

    rows = []
    for sample in samples:
        answer = sample.get("answer")
        row: dict[str, Any] = {"prompt": sample.get("prompt"), "answer": answer}
        for model in MODELS:
            if model in sample:
                row[model] = sample[model]
                if answer is not None:
                    row[f"{model}_correct"] = bool(task_accuracy(sample[model], answer))
                if f"loops/{model}" in sample:
                    row[f"{model}_loops"] = bool(sample[f"loops/{model}"])
        for key, value in sample.items():
            if key.startswith("verdict/"):
                judge, _, against = key.removeprefix("verdict/").rpartition("_vs_")
                row[f"{judge}: policy vs {against}"] = _verdict(value, against)
        rows.append(row)
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    return {c: [row.get(c) for row in rows] for c in columns}


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
        import mlflow

        from alignflow.evaluation.cost import DEVICE_TAG, device_name
        from alignflow.evaluation.evaluate import evaluate_paths
        from alignflow.evaluation.plots import report_plots
        from alignflow.models.factory import inference_device, inference_dtype
        from alignflow.registry.tracking import log_report

        progress.note("generating and judging completions: policy, reference, champion")
        device = inference_device()
        if mlflow.active_run() is not None:  # where its models generate and score, as the trainers tag theirs
            mlflow.set_tag(DEVICE_TAG, device_name(str(device)))
        report = evaluate_paths(
            inputs.data_dir,
            inputs.policy_dir,
            inputs.reference_dir,
            inputs.reward_dir,
            inputs.champion_dir,
            config.evaluation,
            golden_path=inputs.golden_path,
            champion_reward_dir=inputs.champion_reward_dir,
            dtype=inference_dtype(config.model),
            rl_start_dir=inputs.rl_start_dir,
            device=device,
        )
        compared = inputs.champion_dir is not None
        report.info.update({"data_version": inputs.data_version, "champion_compared": compared})
        if inputs.golden_path:
            report.info["golden_path"] = inputs.golden_path
        out = inputs.output_dir
        paths = log_report(report, out, report_plots(report, Path(out) / "plots"))
        if report.samples and mlflow.active_run() is not None:  # the UI's table/evaluation view
            mlflow.log_table(data=completions_table(report.samples), artifact_file=COMPLETIONS_TABLE)
        slices = {k: v for k, v in report.info.items() if k in SLICE_INFO}  # the gates name them
        return {
            "metrics": report.gate_metrics(),
            "slices": slices,
            "report": str(paths["json"]),
            "output_dir": out,
        }

    return run_in_stage("evaluate", config, inputs.parent_run_id, call)
