"""Conflicts keep the conflicting body (size-capped) for the payload review window.

Revision ID: 0006_evidence
Revises: 0005_citus_keys
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_evidence"
down_revision = "0005_citus_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the kept incoming body and its size to conflicts."""
    with op.batch_alter_table("conflicts") as batch:
        batch.add_column(sa.Column("incoming_body", sa.Text))
        batch.add_column(sa.Column("incoming_size", sa.Integer))


def downgrade() -> None:
    """Drop the kept bodies."""
    with op.batch_alter_table("conflicts") as batch:
        batch.drop_column("incoming_size")
        batch.drop_column("incoming_body")
