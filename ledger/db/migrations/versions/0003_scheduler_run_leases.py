"""Scheduler runs carry a lease: a run whose holder died is abandoned once it runs out.

Revision ID: 0003_scheduler_run_leases
Revises: 0002_tokens
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0003_scheduler_run_leases"
down_revision = "0002_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add scheduler_runs.leased_until and an index of the runs still running."""
    with op.batch_alter_table("scheduler_runs") as batch:
        batch.add_column(sa.Column("leased_until", UTCDateTime))
    op.create_index("ix_scheduler_runs_running", "scheduler_runs", ["job"],
                    postgresql_where=sa.text("outcome = 'running'"),
                    sqlite_where=sa.text("outcome = 'running'"))


def downgrade() -> None:
    """Drop the lease column and its index."""
    op.drop_index("ix_scheduler_runs_running", table_name="scheduler_runs")
    with op.batch_alter_table("scheduler_runs") as batch:
        batch.drop_column("leased_until")
