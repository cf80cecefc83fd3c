"""instances.handles: the event types a worker instance has handlers for.

A worker publishes them with its heartbeat, so that the dashboard shows which
instance handles what, and so that a worker without the handler of a type leaves
that type's events to a live worker that has it (a rolling deploy that adds a
handler). A JSON array of event types; NULL for other kinds of instance.

Revision ID: 0020_instance_handles
Revises: 0019_jobs_scope_due
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_instance_handles"
down_revision = "0019_jobs_scope_due"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add instances.handles."""
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("handles", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop instances.handles."""
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("handles")
