"""scope_totals repairs itself a slice of scopes per run: where its last run left off
(`rollup_marks.repaired_scope`).

Each rollups run recounts the receipts of the next few scopes whole, as many as the time
since the previous run is of a day, instead of every receipt once a day (jobs/rollups.py):
at 10M receipts that daily recount made one run a day take 2.4-2.6 s of counting alone.

Revision ID: 0018_scope_totals_repair
Revises: 0017_series_failed_covering
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_scope_totals_repair"
down_revision = "0017_series_failed_covering"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add rollup_marks.repaired_scope (both databases)."""
    with op.batch_alter_table("rollup_marks") as batch:
        batch.add_column(sa.Column("repaired_scope", sa.Integer))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("rollup_marks") as batch:
        batch.drop_column("repaired_scope")
