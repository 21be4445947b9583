"""Prefect tasks for the data stage: validate, snapshot and version (one ``add_dataset`` call),
and pin the evaluation set (one ``pin_golden_set`` call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tasks.retry import retry_transient
from tasks.stage_task import pipeline_config, run_in_stage

LABEL_REPORT = Path(".alignflow") / "reports" / "label-check.json"
CONTAMINATION_REPORT = Path(".alignflow") / "reports" / "pinned-set-check.json"
ANSWER_LABEL_REPORT = Path(".alignflow") / "reports" / "answer-label-check.json"


def answers_guard(config: Any, repo_dir: str) -> Any:
    """The labels against the pairs' own verifiable answers (no champion needed)."""
    from alignflow.evaluation.label_check import answer_label_guard

    if config.data.label_check_max_gap is None:
        return None
    report = Path(repo_dir).resolve() / ANSWER_LABEL_REPORT
    return answer_label_guard(config.data.label_check_max_gap, report, config.evaluation.slice_fields)


def pinned_guard(config: Any, repo_dir: str) -> Any:
    """The check that no training row repeats a pinned prompt, once a pinned set exists."""
    from alignflow.evaluation.contamination import contamination_guard
    from alignflow.evaluation.golden import existing_pinned_records

    pinned = existing_pinned_records(config.evaluation, repo_dir)
    if not pinned:
        return None
    return contamination_guard(pinned, Path(repo_dir).resolve() / CONTAMINATION_REPORT)


def champion_guard(config: Any, judge: dict[str, Any] | None, repo_dir: str) -> Any:
    """The labels against the champion reward model (``judge``: its ``model_dir`` and pinned
    ``accuracy``), when there is one and the check is on."""
    from alignflow.evaluation.label_check import label_guard

    if not judge or config.data.label_check_max_gap is None:
        return None
    return label_guard(
        judge["model_dir"],
        float(judge["accuracy"]),
        config.data.label_check_max_gap,
        Path(repo_dir).resolve() / LABEL_REPORT,
        config.data.label_check_pairs,
        config.seed,
    )


def data_guards(config: Any, repo_dir: str, judge: dict[str, Any] | None) -> tuple[Any, Any]:
    """Every check new data gets before it is versioned, as ``add_dataset``'s ``check_labels``
    and ``check_training`` hooks: the same for ``alignflow run`` and ``alignflow data add``."""
    from alignflow.evaluation.label_check import all_of

    labels = all_of(answers_guard(config, repo_dir), champion_guard(config, judge, repo_dir))
    return labels, pinned_guard(config, repo_dir)


@task(name="version-data", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_transient)
def version_data(
    config_json: dict,
    source: str,
    repo_dir: str = ".",
    parent_run_id: str | None = None,
    label_judge: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate ``source``; when it passes, write the snapshot, ``dvc add`` and push it.

    ``label_judge`` (the champion reward model's ``model_dir`` and pinned ``accuracy``)
    turns on the poisoned-data check: labels it contradicts stop the run before anything
    is versioned; labels that contradict the pairs' own verifiable answers stop it too. Once
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


@task(name="pin-golden", retries=2, retry_delay_seconds=5, retry_condition_fn=retry_transient)
def pin_golden(config_json: dict, data_dir: str, repo_dir: str = ".") -> dict[str, Any]:
    """The pinned evaluation set: the configured file, or ``golden/`` frozen on first use."""
    from alignflow.evaluation.golden import pin_golden_set

    config = pipeline_config(config_json)
    return pin_golden_set(config.evaluation, data_dir, repo_dir, config.data.remote).as_dict()
