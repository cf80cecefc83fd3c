"""Refusals and intake latency per integration and hour; an incremental hourly series;
the delivery log's outcome index.

Revision ID: 0011_health_rollups
Revises: 0010_durable_failure_groups
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0011_health_rollups"
down_revision = "0010_durable_failure_groups"
branch_labels = None
depends_on = None


def _hourly_series(settled: bool) -> None:
    """Create hourly_series (with its settled column and failed index when `settled`)."""
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("hour", UTCDateTime, nullable=False),
        sa.Column("accepted", sa.BigInteger, nullable=False),
        sa.Column("failed", sa.BigInteger, nullable=False),
        sa.Column("refreshed_at", UTCDateTime, nullable=False),
    ]
    if settled:
        columns.append(sa.Column("settled", sa.BigInteger, nullable=False))
    op.create_table("hourly_series", *columns,
                    sa.PrimaryKeyConstraint("scope_id", "hour", name="pk_hourly_series"))
    if settled:
        op.create_index("ix_hourly_series_failed", "hourly_series", ["scope_id", "hour"],
                        postgresql_where=sa.text("failed > 0"),
                        sqlite_where=sa.text("failed > 0"))


def upgrade() -> None:
    """Rebuild hourly_series empty (a rollup: the next run recounts it); add the new ones."""
    op.drop_table("hourly_series")
    _hourly_series(settled=True)
    op.create_table(
        "hourly_refusals",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("hour", UTCDateTime, nullable=False),
        sa.Column("refused", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "hour", name="pk_hourly_refusals"),
    )
    op.create_table(
        "hourly_latency",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("hour", UTCDateTime, nullable=False),
        sa.Column("bucket", sa.SmallInteger, nullable=False),
        sa.Column("deliveries", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "hour", "bucket", name="pk_hourly_latency"),
    )
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("latency_us", sa.Integer))
    op.create_index("ix_deliveries_outcome", "deliveries", ["outcome", "at", "id"],
                    postgresql_where=sa.text("outcome <> 'accepted'"),
                    sqlite_where=sa.text("outcome <> 'accepted'"))


def downgrade() -> None:
    """Drop the new rollups and the latency column; hourly_series back to its old shape."""
    op.drop_index("ix_deliveries_outcome", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("latency_us")
    op.drop_table("hourly_latency")
    op.drop_table("hourly_refusals")
    op.drop_table("hourly_series")
    _hourly_series(settled=False)
