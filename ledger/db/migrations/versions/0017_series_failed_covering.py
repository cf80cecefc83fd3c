"""ix_hourly_series_failed carries the failed figure on PostgreSQL, so a rollups run reads
the stored failed cells from the index alone.

Every run compares the failed receipts per scope and hour with the stored cells that have
failures (jobs/rollup_series.py `_failed_changes`). At 10M receipts, 95,000 such cells lay
on 15,654 heap pages of hourly_series, fetched at random: 99-124 ms of the statement's
455 ms. SQLite keeps the index as it is (it
has no INCLUDE).

Revision ID: 0017_series_failed_covering
Revises: 0016_receipts_open_covering
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_series_failed_covering"
down_revision = "0016_receipts_open_covering"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Rebuild ix_hourly_series_failed with INCLUDE (failed) (PostgreSQL only)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_hourly_series_failed", table_name="hourly_series")
    op.create_index("ix_hourly_series_failed", "hourly_series", ["scope_id", "hour"],
                    postgresql_where=sa.text("failed > 0"), postgresql_include=["failed"])


def downgrade() -> None:
    """Rebuild ix_hourly_series_failed without the included column (PostgreSQL only)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_hourly_series_failed", table_name="hourly_series")
    op.create_index("ix_hourly_series_failed", "hourly_series", ["scope_id", "hour"],
                    postgresql_where=sa.text("failed > 0"))
