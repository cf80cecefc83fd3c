"""hourly_totals: hourly_series summed over every scope, kept by the rollups.

The Capacity page and API read the ledger's accepted receipts of the last 24 hours:
summed from hourly_series that is one row per scope and hour, 240,000 rows at 10,000
scopes. The rollups now keep the sum per hour beside the series (jobs/rollup_series.py);
this migration fills it from the series as it stands.

Revision ID: 0025_hourly_totals
Revises: 0024_sender_tokens
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_hourly_totals"
down_revision = "0024_sender_tokens"
branch_labels = None
depends_on = None

# schema.UTCDateTime's DDL (the migration never imports live code).
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the table and fill it from hourly_series."""
    op.create_table(
        "hourly_totals",
        sa.Column("hour", UTC_DATETIME, primary_key=True),
        sa.Column("accepted", sa.BigInteger, nullable=False),
        sa.Column("failed", sa.BigInteger, nullable=False),
    )
    op.execute("INSERT INTO hourly_totals (hour, accepted, failed) "
               "SELECT hour, sum(accepted), sum(failed) FROM hourly_series GROUP BY hour")


def downgrade() -> None:
    """Drop it."""
    op.drop_table("hourly_totals")
