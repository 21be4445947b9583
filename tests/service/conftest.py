"""Fixtures for the feedback service: one app per test on SQLite or on a fresh PostgreSQL database."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alignflow.service.app import create_app
from alignflow.service.jobs import TrainingLauncher
from alignflow.service.settings import ServiceSettings, TokenSpec

ADMIN = "admin-token-0123456789abcdef"
SCOPED = "scoped-token-0123456789abcdef"  # may act for agent "other-agent" only
SCOPED_AGENT = "other-agent"


def auth(token: str = ADMIN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="session")
def postgres_database(postgres_url: str) -> Iterator[str]:
    """A database created for this test session on the real server, dropped afterwards."""
    import sqlalchemy as sa

    name = f"alignflow_service_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request, tmp_path: Path) -> Iterator[str]:
    """Each service test runs on SQLite and on PostgreSQL (tables emptied between tests)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'service.db'}"
        return
    url = request.getfixturevalue("postgres_database")
    yield url
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        tables = [
            t
            for t in ("feedback", "jobs", "api_tokens", "generations", "traffic_splits")
            if sa.inspect(conn).has_table(t)
        ]
        if tables:
            conn.execute(sa.text(f"TRUNCATE {', '.join(tables)}"))
    engine.dispose()


@pytest.fixture
def make_settings(database_url: str, tmp_path: Path) -> Callable[..., ServiceSettings]:
    def build(**overrides) -> ServiceSettings:
        values = {
            "database_url": database_url,
            "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
            "work_dir": tmp_path / "work",
            "tokens": [
                TokenSpec(token=ADMIN, name="admin"),
                TokenSpec(token=SCOPED, name="scoped", agents=[SCOPED_AGENT]),
            ],
            **overrides,
        }
        return ServiceSettings(**values)

    return build


@pytest.fixture
def make_client(make_settings) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def build(launcher: TrainingLauncher | None = None, **overrides) -> TestClient:
        client = TestClient(create_app(make_settings(**overrides), launcher), raise_server_exceptions=False)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.app.state.runner.shutdown(wait=True)
        client.app.state.engine.dispose()


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()


@pytest.fixture
def served(monkeypatch, tmp_path: Path) -> dict:
    """Run ``alignflow api`` up to uvicorn in a scratch folder and keep the app it would serve;
    the service's own environment variables are cleared so that only the test's settings count."""
    import uvicorn

    captured: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda application, **kw: captured.update(app=application, **kw))
    monkeypatch.chdir(tmp_path)
    for name in ("ALIGNFLOW_API_TOKEN", "ALIGNFLOW_API_TOKENS", "ALIGNFLOW_API_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return captured
