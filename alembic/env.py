"""Alembic environment: runs on a connection handed over by orchestrator.store.db, or on a URL."""

from __future__ import annotations

from sqlalchemy import create_engine

from alembic import context
from orchestrator.store.db import default_url
from orchestrator.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = config.get_main_option("sqlalchemy.url") or default_url()
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    with create_engine(url).connect() as conn:
        _run(conn)
        conn.commit()
