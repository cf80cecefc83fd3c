"""Alembic environment: the URL comes from the caller (ledger.db.engine.upgrade) or DATABASE_URL.

`target_metadata` and the comparison options make `alembic revision --autogenerate`
(with `script_location` pointing here) propose only real differences.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from ledger.config import database_url_from_env
from ledger.db.schema import autogenerate_options, metadata

config = context.config
target_metadata = metadata


def run_migrations() -> None:
    """Run migrations online against the configured database."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=connection.dialect.name == "sqlite",
                          **autogenerate_options(connection.dialect.name))
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or database_url_from_env()
    engine = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata,
                          render_as_batch=conn.dialect.name == "sqlite",
                          **autogenerate_options(conn.dialect.name))
        with context.begin_transaction():
            context.run_migrations()


run_migrations()
