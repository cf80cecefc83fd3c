"""acme_invoices: one row per paid invoice.

Revision ID: acme_0001_invoices
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "acme_0001_invoices"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create acme_invoices."""
    op.create_table(
        "acme_invoices",
        sa.Column("scope_id", sa.Integer, primary_key=True),
        sa.Column("invoice_id", sa.Text, primary_key=True),
        sa.Column("amount_cents", sa.Integer, nullable=False),
        sa.Column("paid_by_event", sa.Text, nullable=False),
    )


def downgrade() -> None:
    """Drop acme_invoices."""
    op.drop_table("acme_invoices")
