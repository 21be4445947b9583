"""A pipeline run's parent MLflow run, made to read as one comparable row in the UI.

The parent carries the resolved config as params (dotted keys, as transformers' MLflow
callback logs its training arguments), the headline results as metrics, a name that says
what ran on which data, and the data version as a dataset input (the UI's Dataset column).
A stage the cache answered still shows under it, as a child run pointing at the run that
did the work, so that every parent lists its whole chain.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE
from pydantic import BaseModel

from alignflow.evaluation.cost import totals
from alignflow.evaluation.intervals import BOUND_SUFFIXES
from alignflow.evaluation.metric_names import (
    GOLDEN,
    KL_TO_REFERENCE,
    LENGTH_GROWTH_RATIO,
    LOOP_RATE,
    REFERENCE_LOOP_RATE,
    REWARD_ACCURACY,
    RL_GAIN,
    TASK_ACCURACY,
    is_win_rate,
    promoted_key,
)
from alignflow.registry import tracking
from alignflow.registry.runs import PARENT_RUN_TAG, child_runs, stage_run

PIPELINE_TAG = "alignflow.pipeline"  # on a parent run: the flow that made it (its name no longer says)
CACHE_HIT_TAG = "alignflow.cache_hit"  # on a stage run that only stands for a reused result
REUSED_RUN_TAG = "alignflow.reused_run"  # ... and the stage run that produced that result
REUSED_PIPELINE_TAG = "alignflow.reused_pipeline_run"  # ... and the pipeline run that one belonged to
SHORT_VERSION = 7  # characters of the DVC md5 in a run name, as git shortens commits
DATASET_CONTEXT = "training"
# pinned-set figures (the interval and n beside each come along), the KL and how often the
# policy and its reference loop, for the parent
HEADLINE = (
    TASK_ACCURACY,
    RL_GAIN,
    LENGTH_GROWTH_RATIO,
    REWARD_ACCURACY,
    KL_TO_REFERENCE,
    LOOP_RATE,
    REFERENCE_LOOP_RATE,
)


def run_name(project: str, algorithm: str, data_version: str | None = None) -> str:
    """``<project>-<algorithm>-<short data version>``: what ran, on which data, at a glance."""
    parts = [project, algorithm, *([data_version[:SHORT_VERSION]] if data_version else [])]
    return "-".join(parts)


def rename_run(tracking_uri: str, run_id: str, name: str) -> None:
    """Give a run its final name once what it is called by (the data version) is known."""
    MlflowClient(tracking_uri).update_run(run_id, name=name)


def config_params(config: BaseModel) -> dict[str, Any]:
    """The resolved config as nested params, without the tracking URI (it may hold a password)."""
    return config.model_dump(mode="json", exclude={"tracking": {"uri"}})


CONFIG_ARTIFACT = "config.json"  # the resolved config whole, as `alignflow replay` reads it back


def log_config(config: BaseModel) -> None:
    """Every resolved config key as a param of the active run (``dpo.beta``, ``model.name``),
    and the whole config as ``config.json``: params are cut at MLflow's length limit, and a
    replay needs every value as it was."""
    params = config_params(config)
    tracking.log_params(params)
    mlflow.log_dict(params, CONFIG_ARTIFACT)


def log_data_version(data_dir: str | Path, data_version: str, context: str = DATASET_CONTEXT) -> None:
    """The DVC-tracked snapshot as the active run's dataset input: its md5 as digest, its
    folder as source, so the UI's Dataset column says which data a run saw."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # MLflow registers its local source twice and says so
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        source = resolve_dataset_source(str(Path(data_dir).resolve()))
    # MLflow marks Dataset.profile abstract, but Dataset is no ABC: MetaDataset is usable as it is
    dataset = MetaDataset(source, name=Path(data_dir).name, digest=data_version)  # type: ignore[abstract]
    mlflow.log_input(dataset, context=context)


def is_headline(key: str) -> bool:
    """Whether an evaluation metric belongs on the parent run: a headline figure, every
    pinned-set win rate, and the interval bounds and n beside them."""
    base = next((key.removesuffix(s) for s in BOUND_SUFFIXES if key.endswith(s)), key)
    return base in HEADLINE or (base.startswith(f"{GOLDEN}/") and is_win_rate(base))


def headline_metrics(eval_metrics: Mapping[str, Any], promoted: Mapping[str, bool]) -> dict[str, float]:
    """The parent run's results: the headline evaluation figures and ``promoted/<role>`` 0/1."""
    figures = {k: v for k, v in eval_metrics.items() if is_headline(k)}
    return {**figures, **{promoted_key(role): float(bool(held)) for role, held in promoted.items()}}


def log_headline_metrics(eval_metrics: Mapping[str, Any], promoted: Mapping[str, bool]) -> None:
    tracking.log_metrics(headline_metrics(eval_metrics, promoted))


def _run_link(run: Run | None, run_id: str) -> str:
    """A link the MLflow UI resolves to the run's page (its routes live after ``#``)."""
    if run is None:
        return f"`{run_id}`"
    return f"[`{run_id}`](#/experiments/{run.info.experiment_id}/runs/{run_id})"


def reuse_note(stage: str, producer: Run, pipeline: Run | None) -> str:
    """The cache-hit run's description: where the result it stands for comes from."""
    note = (
        f"**Cache hit**: `{stage}` did not run again in this pipeline run. Its result is the one "
        f"run {_run_link(producer, producer.info.run_id)} produced"
    )
    if pipeline is not None:
        note += f", in pipeline run {_run_link(pipeline, pipeline.info.run_id)}"
    return note + "."


def _producing_run(client: MlflowClient, run_id: str) -> Run:
    """The run that did the work: a cache-hit run stands for the one it points at."""
    run = client.get_run(run_id)
    reused = run.data.tags.get(REUSED_RUN_TAG)
    return client.get_run(reused) if reused else run


def cache_hit_run(
    tracking_uri: str,
    parent_run_id: str,
    stage: str,
    produced_by: str,
    metrics: Mapping[str, Any] | None = None,
) -> str | None:
    """A child run under ``parent_run_id`` for a stage the cache answered, tagged and described
    with the run that produced the result (and that run's metrics, for side-by-side views).

    None when the producing run already belongs to this pipeline run (nothing to point at).
    """
    client = MlflowClient(tracking_uri)
    producer = _producing_run(client, produced_by)
    pipeline_id = producer.data.tags.get(PARENT_RUN_TAG)
    if parent_run_id in (pipeline_id, producer.info.run_id):
        return None
    pipeline = client.get_run(pipeline_id) if pipeline_id else None
    tags = {
        CACHE_HIT_TAG: "true",
        REUSED_RUN_TAG: producer.info.run_id,
        **({REUSED_PIPELINE_TAG: pipeline_id} if pipeline_id else {}),
        MLFLOW_RUN_NOTE: reuse_note(stage, producer, pipeline),
    }
    with stage_run(tracking_uri, parent_run_id, stage, tags) as run:
        tracking.log_metrics(metrics or {})
    return run.info.run_id


def run_cost(tracking_uri: str, parent_run_id: str) -> tuple[dict[str, float], list[str]]:
    """What a pipeline run's stages cost together, as their runs logged it (``cost/*``), and
    the stages the cache answered: each counted at what it cost the run that did the work,
    since the model it handed on cost that much to make."""
    client = MlflowClient(tracking_uri)
    spent, reused = [], []
    for run in child_runs(tracking_uri, parent_run_id):
        producer = run.data.tags.get(REUSED_RUN_TAG)
        if producer:
            reused.append(run.info.run_name)
        spent.append(client.get_run(producer).data.metrics if producer else run.data.metrics)
    return totals(spent), sorted(reused)
