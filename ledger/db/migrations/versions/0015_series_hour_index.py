"""An index on hourly_series.hour: each rollups run reads the cells of a few hours
(the band's edges, the hour it recounts whole) and drops the hours past the window.

The primary key starts with scope_id, so without it each of those read the whole
series (1.7M cells at 10M receipts over 10,000 scopes: 0.13-0.19 s each, bench/README.md
"Flat costs at scale").

Revision ID: 0015_series_hour_index
Revises: 0014_token_write_position
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0015_series_hour_index"
down_revision = "0014_token_write_position"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Index hourly_series by hour (both databases)."""
    op.create_index("ix_hourly_series_hour", "hourly_series", ["hour"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("ix_hourly_series_hour", table_name="hourly_series")
