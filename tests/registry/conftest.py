"""Registry fixtures: a tmp sqlite tracking store and a real ``mlflow server`` on loopback."""

from __future__ import annotations

import pytest

from alignflow.registry.server import local_mlflow_server


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
