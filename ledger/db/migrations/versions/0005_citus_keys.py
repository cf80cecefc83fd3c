"""Key conflicts and attempts by (id, scope_id), so that they can be distributed by scope.

Citus requires every primary key and unique constraint of a distributed table to
include its distribution column (`ledger db distribute`, README "Scaling past one
database"). `id` stays unique on its own: the sequence still numbers the rows.
SQLite keeps `id` as its lone INTEGER PRIMARY KEY: that is what makes it the
rowid, numbered by SQLite itself, and SQLite is never distributed.

Revision ID: 0005_citus_keys
Revises: 0004_profiles
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0005_citus_keys"
down_revision = "0004_profiles"
branch_labels = None
depends_on = None

TABLES = ("conflicts", "attempts")


def upgrade() -> None:
    """Make (id, scope_id) the primary key of conflicts and attempts on PostgreSQL."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.drop_constraint(f"{table}_pkey", table, type_="primary")
        op.create_primary_key(f"{table}_pkey", table, ["id", "scope_id"])


def downgrade() -> None:
    """Key conflicts and attempts by id alone again."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.drop_constraint(f"{table}_pkey", table, type_="primary")
        op.create_primary_key(f"{table}_pkey", table, ["id"])
