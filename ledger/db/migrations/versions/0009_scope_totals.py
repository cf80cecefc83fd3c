"""Settled receipt totals per scope, so the rollups job counts only what changed.

Revision ID: 0009_scope_totals
Revises: 0008_instances_and_groups
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0009_scope_totals"
down_revision = "0008_instances_and_groups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create scope_totals and rollup_marks (empty: the next rollups run recounts in full)."""
    op.create_table(
        "scope_totals",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("settled", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", name="pk_scope_totals"),
    )
    op.create_table(
        "rollup_marks",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("settled_from", UTCDateTime, nullable=False),
        sa.Column("settled_until", UTCDateTime, nullable=False),
        sa.Column("counted_at", UTCDateTime, nullable=False),
        sa.Column("recounted_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_rollup_marks"),
    )


def downgrade() -> None:
    """Drop rollup_marks and scope_totals."""
    op.drop_table("rollup_marks")
    op.drop_table("scope_totals")
