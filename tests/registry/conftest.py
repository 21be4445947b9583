"""Registry fixtures: a tmp sqlite tracking store and a real ``mlflow server`` on loopback."""

from __future__ import annotations

import pytest

from alignflow.evaluation.challenger import put_estimate
from alignflow.evaluation.intervals import Estimate
from alignflow.registry.server import local_mlflow_server


def pinned_metrics(answers: int = 100, **figures: tuple[float, float, float, int]) -> dict[str, float]:
    """Pinned-set metrics as the evaluation writes them: ``name=(value, low, high, n)``."""
    metrics: dict[str, float | None] = {"golden/answers": float(answers)}
    for name, (value, low, high, n) in figures.items():
        put_estimate(metrics, f"golden/{name.replace('__', '/')}", Estimate(value, low, high, n, "test"))
    return {k: v for k, v in metrics.items() if v is not None}


# a sound first policy: well above its reference, judged by the champion reward model
FIRST_POLICY = pinned_metrics(
    task_accuracy_gain=(0.9, 0.85, 0.95, 120),
    champion_reward__win_rate_vs_reference=(0.95, 0.9, 0.98, 120),
    length_growth_ratio=(1.4, 1.35, 1.45, 120),
    loop_rate_vs_reference=(0.0, -0.03, 0.03, 120),
)
# the same, also compared with a champion it matches
MATCHES_CHAMPION = FIRST_POLICY | pinned_metrics(
    task_accuracy_vs_champion=(0.01, -0.02, 0.04, 120),
    champion_reward__win_rate_vs_champion=(0.52, 0.45, 0.6, 120),
    length_growth_vs_champion=(1.0, 0.98, 1.02, 120),
    worst_slice_task_accuracy_vs_champion=(-0.125, -0.47, 0.24, 8),  # one of eight items lost
)


@pytest.fixture
def tracking_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


@pytest.fixture
def artifact_dir(tmp_path) -> str:
    return str(tmp_path / "artifacts")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` subprocess (sqlite backend, proxied artifacts); yields it."""
    with local_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.fixture
def registry(tmp_path, tiny_model_dir):
    """The tiny policy logged and registered in a tmp sqlite store; returns (uri, the LoggedVersion)."""
    import mlflow
    from mlflow import MlflowClient

    from alignflow.registry import models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = models.log_model(tiny_model_dir, uri, "demo-policy", tags={"data.version": "d1"})
    return uri, logged
