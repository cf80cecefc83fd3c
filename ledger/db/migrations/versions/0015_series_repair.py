"""The hourly series repairs itself one hour per run: where its last run left off
(`rollup_marks.repaired_hour`), and an index on hourly_series.hour.

Each rollups run recounts one hour of the 7-day window whole, the hour after the one
the last run recounted (jobs/rollup_series.py), instead of the whole window once a day.
Each run also reads the cells of a few hours (the band's edges, the hour it recounts)
and drops the hours past the window; the primary key starts with scope_id, so without
the index each of those read the whole series (1.7M cells at 10M receipts over 10,000
scopes: 0.13-0.19 s each).

Revision ID: 0015_series_repair
Revises: 0014_token_write_position
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_series_repair"
down_revision = "0014_token_write_position"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add rollup_marks.repaired_hour and index hourly_series by hour (both databases)."""
    with op.batch_alter_table("rollup_marks") as batch:
        batch.add_column(sa.Column("repaired_hour", sa.Integer))
    op.create_index("ix_hourly_series_hour", "hourly_series", ["hour"])


def downgrade() -> None:
    """Drop the index and the column."""
    op.drop_index("ix_hourly_series_hour", table_name="hourly_series")
    with op.batch_alter_table("rollup_marks") as batch:
        batch.drop_column("repaired_hour")
