"""Where each bounded sweep stopped: the failure-group sweep walks its tables in key order.

Revision ID: 0013_sweep_marks
Revises: 0012_receipts_accepted_btree
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0013_sweep_marks"
down_revision = "0012_receipts_accepted_btree"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create sweep_marks (empty: every sweep starts at the beginning)."""
    op.create_table(
        "sweep_marks",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("position", sa.Text, nullable=False),
        sa.Column("swept_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sweep_marks"),
    )


def downgrade() -> None:
    """Drop sweep_marks."""
    op.drop_table("sweep_marks")
