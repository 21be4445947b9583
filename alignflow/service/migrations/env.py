"""Alembic environment: runs online against the connection the service hands over.

The service calls :func:`alignflow.service.migrate.upgrade_database`, which puts an open
connection into ``config.attributes``; the ``alembic`` command line works too when
``sqlalchemy.url`` is set.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from alignflow.service.storage import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("alignflow's service migrations run online only")
run_online()
