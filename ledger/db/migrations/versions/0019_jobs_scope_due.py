"""ix_jobs_scope_due: one scope's due jobs, oldest first, for the batch claim (PostgreSQL).

A batch of the worker (LEDGER_WORKER_BATCH > 1) holds the rows its handlers write until
it commits. Batches of the oldest due jobs of many scopes make workers wait on each
other's per-scope rows (most sessions sampled in a lock wait), so a batch now takes the oldest due
job and the next due jobs of
its scope (ledger/worker/sql.py, CLAIM_BATCH_SQL), found by this index. SQLite has one
writer and keeps its plain oldest-first claim: no index there.

Revision ID: 0019_jobs_scope_due
Revises: 0018_scope_totals_repair
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_jobs_scope_due"
down_revision = "0018_scope_totals_repair"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ix_jobs_scope_due (PostgreSQL only; partial: the pending jobs)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_index("ix_jobs_scope_due", "jobs", ["scope_id", "run_at"],
                    postgresql_where=sa.text("status = 0"))


def downgrade() -> None:
    """Drop ix_jobs_scope_due (PostgreSQL only)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_jobs_scope_due", table_name="jobs")
