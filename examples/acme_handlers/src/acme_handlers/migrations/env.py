"""Alembic environment of Acme's migrations: its own version table, the caller's connection."""

from __future__ import annotations

from alembic import context

from acme_handlers.migrate import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
