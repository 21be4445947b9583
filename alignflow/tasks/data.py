"""Prefect tasks for the data stage: validate, snapshot and version (one ``add_dataset`` call),
and pin the evaluation set (one ``pin_golden_set`` call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from alignflow.tasks.retry import retry_transient
from alignflow.tasks.stage_task import pipeline_config, run_in_stage

LABEL_REPORT = Path(".alignflow") / "reports" / "label-check.json"
CONTAMINATION_REPORT = Path(".alignflow") / "reports" / "pinned-set-check.json"


def pinned_guard(config: Any, repo_dir: str) -> Any:
    """The check that no training row repeats a pinned prompt, once a pinned set exists."""
    from alignflow.evaluation.contamination import contamination_guard
    from alignflow.evaluation.golden import existing_pinned_records

    pinned = existing_pinned_records(config.evaluation, repo_dir)
    if not pinned:
        return None
    return contamination_guard(pinned, Path(repo_dir).resolve() / CONTAMINATION_REPORT)


def labels_guard(config: Any, judge: dict[str, Any] | None, repo_dir: str) -> Any:
    """The label check, when it is on: the verifiable answers first, then the champion reward
    model (``judge``: its ``model_dir`` and pinned ``accuracy``; None before there is one) where
    it passes its audit against them and is competent on pinned pairs like the new ones."""
    from alignflow.evaluation.golden import existing_pinned_records
    from alignflow.evaluation.label_check import label_guard

    if config.data.label_check_max_gap is None:
        return None
    reference = (existing_pinned_records(config.evaluation, repo_dir) or []) if judge else []
    return label_guard(
        judge["model_dir"] if judge else None,
        float(judge["accuracy"]) if judge else None,
        config.data.label_check_max_gap,
        Path(repo_dir).resolve() / LABEL_REPORT,
        config.data.label_check_pairs,
        config.seed,
        reference=reference,
        slice_fields=config.evaluation.slice_fields,
    )


def data_guards(config: Any, repo_dir: str, judge: dict[str, Any] | None) -> tuple[Any, Any]:
    """Every check new data gets before it is versioned, as ``add_dataset``'s ``check_labels``
    and ``check_training`` hooks: the same for ``alignflow run`` and ``alignflow data add``."""
    return labels_guard(config, judge, repo_dir), pinned_guard(config, repo_dir)


@task(name="version-data", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_transient)
def version_data(
    config_json: dict,
    source: str,
    repo_dir: str = ".",
    parent_run_id: str | None = None,
    label_judge: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate ``source``; when it passes, write the snapshot, ``dvc add`` and push it.

    The label check stops the run before anything is versioned where the pairs' verifiable
    answers contradict their labels, or ``label_judge`` (the champion reward model's
    ``model_dir`` and pinned ``accuracy``) does on pairs it is competent on
    (``label_disagreement``); and where pairs are left that no judge can judge
    (``cannot_judge``), unless the reused data version records a reason they were accepted
    (``alignflow data add --accept-unjudged``): a scheduled run never trains on unjudged data. Once
    a pinned set exists, a training row that repeats a pinned prompt stops the run as well
    (``pinned_prompt_in_training``). Not cached by Prefect: ``add_dataset`` itself recognises
    an input it has already turned into the tracked snapshot and returns that version with
    ``cached`` set (the checks still run on it).
    """
    config = pipeline_config(config_json)

    def call() -> dict[str, Any]:
        from alignflow.data.pipeline import add_dataset

        labels, training = data_guards(config, repo_dir, label_judge)
        result = add_dataset(
            source, config.data, repo_dir=repo_dir, check_labels=labels, check_training=training
        )
        verdict = getattr(labels, "verdict", None)
        return {
            "version": result.version,
            "data_dir": str(Path(result.data_dir).resolve()),
            "metrics": {f"data/{k}": float(v) for k, v in result.counts.items()},
            "report_path": result.report_path,
            "manifest_path": result.manifest_path,
            "summary": result.validation.summary,
            "cached": result.reused,
            "accepted_unjudged": result.accepted_unjudged,
            # the champion reward model failed its audit against the verifiable answers of this
            # data: it counts nowhere in this run (not as a judge of the policy either)
            "discredited_judges": ["champion_reward"]
            if verdict is not None and verdict.judge_discredited
            else [],
            "label_check": None if verdict is None else verdict.describe(),
        }

    return run_in_stage("data", config, parent_run_id, call)


@task(name="pin-golden", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_transient)
def pin_golden(config_json: dict, data_dir: str, repo_dir: str = ".") -> dict[str, Any]:
    """The pinned evaluation set: the configured file, or ``golden/`` frozen on first use."""
    from alignflow.evaluation.golden import pin_golden_set

    config = pipeline_config(config_json)
    return pin_golden_set(config.evaluation, data_dir, repo_dir, config.data.remote).as_dict()
