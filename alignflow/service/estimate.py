"""Dry-run time estimates from what earlier jobs of the same model size measured.

Every finished job records, on its policy version's MLflow run, how many steps its policy
stage ran, how long that stage took and how long the whole job took, tagged with the
model's size and the algorithm. An estimate is the median seconds per step of the latest
such runs (times the steps asked for) plus their median time outside the policy stage.
Until a run of that size and algorithm exists, the service's documented defaults are
used, and the answer says which basis it used.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from alignflow.models.model_config import TINY, ModelSpec
from alignflow.service.settings import TrainingSettings

MODEL_SIZE_TAG = "model.size"
ALGORITHM_TAG = "policy.algorithm"
STEPS_METRIC = "training_steps"
POLICY_SECONDS_METRIC = "policy_seconds"
JOB_SECONDS_METRIC = "job_seconds"
MAX_RUNS = 10


@dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str

    @property
    def minutes(self) -> float:
        return round(self.seconds / 60.0, 2)


def model_size(spec: ModelSpec) -> str:
    """A key shared by runs of one model size: the tiny preset by its dimensions, else its name."""
    if spec.name == TINY:
        return (
            f"tiny-v{spec.vocab_size}-h{spec.hidden_size}-i{spec.intermediate_size}"
            f"-l{spec.num_layers}-a{spec.num_heads}"
        )
    return spec.name


def job_timing_tags(spec: ModelSpec, algorithm: str) -> dict[str, str]:
    return {MODEL_SIZE_TAG: model_size(spec), ALGORITHM_TAG: algorithm}


def _measured(tracking_uri: str, size: str, algorithm: str) -> list[tuple[float, float]]:
    """(seconds per step, seconds outside the policy stage) of the latest matching runs."""
    client = MlflowClient(tracking_uri)
    try:
        experiments = [e.experiment_id for e in client.search_experiments()]
        if not experiments:
            return []
        runs = client.search_runs(
            experiments,
            filter_string=(
                f"tags.`{MODEL_SIZE_TAG}` = '{size}' and tags.`{ALGORITHM_TAG}` = '{algorithm}' "
                f"and metrics.{STEPS_METRIC} > 0"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=MAX_RUNS,
        )
    except MlflowException:
        return []
    rows = []
    for run in runs:
        m = run.data.metrics
        if POLICY_SECONDS_METRIC in m and JOB_SECONDS_METRIC in m:
            rows.append(
                (m[POLICY_SECONDS_METRIC] / m[STEPS_METRIC], m[JOB_SECONDS_METRIC] - m[POLICY_SECONDS_METRIC])
            )
    return rows


def estimate_training_time(
    tracking_uri: str, spec: ModelSpec, algorithm: str, steps: int, defaults: TrainingSettings
) -> Estimate:
    size = model_size(spec)
    measured = _measured(tracking_uri, size, algorithm)
    if measured:
        per_step = statistics.median(r[0] for r in measured)
        overhead = max(statistics.median(r[1] for r in measured), 0.0)
        return Estimate(
            seconds=steps * per_step + overhead,
            basis=(
                f"measured: median of {len(measured)} earlier {algorithm} job(s) of {size} "
                f"({per_step:.3g} s/step, {overhead:.0f} s outside the policy stage)"
            ),
        )
    return Estimate(
        seconds=steps * defaults.seconds_per_step + defaults.overhead_seconds,
        basis=(
            f"default: {defaults.seconds_per_step:g} s/step and {defaults.overhead_seconds:g} s outside the "
            f"policy stage (no earlier {algorithm} job of {size} in MLflow)"
        ),
    )
