"""Fresh PostgreSQL databases for the server tests, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def fresh_database(postgres_url) -> Iterator[Callable[[str], str]]:
    """``fresh_database(prefix)`` creates an empty database and returns its name."""
    import psycopg

    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/postgres"
    created: list[str] = []

    def create(prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return name

    yield create
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_url(postgres_url: str, database: str, driver: str) -> str:
    """The test server's URL for another database and SQLAlchemy driver."""
    base = postgres_url.split("://", 1)[1].rsplit("/", 1)[0]
    return f"postgresql+{driver}://{base}/{database}"
