"""Failure groups get a reviewed state: acknowledged or muted, with a note.

Revision ID: 0008_instances_and_groups
Revises: 0007_delivery_log
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0008_instances_and_groups"
down_revision = "0007_delivery_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create failure_groups (one row per group an operator acknowledged or muted)."""
    op.create_table(
        "failure_groups",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("updated_by", sa.Text, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )


def downgrade() -> None:
    """Drop failure_groups."""
    op.drop_table("failure_groups")
