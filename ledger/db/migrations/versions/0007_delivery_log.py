"""The delivery log: every request to /hooks/, bounded, with its own retention.

Revision ID: 0007_delivery_log
Revises: 0006_evidence
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0007_delivery_log"
down_revision = "0006_evidence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the deliveries table and the indexes its reads walk."""
    op.create_table(
        "deliveries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("integration_id", sa.Integer),
        sa.Column("public_id", sa.Text),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("http_status", sa.SmallInteger, nullable=False),
        sa.Column("key_id", sa.Text),
        sa.Column("event_id", sa.Text),
        sa.Column("client", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.create_index("ix_deliveries_at", "deliveries", ["at", "id"])
    op.create_index("ix_deliveries_integration", "deliveries", ["integration_id", "at", "id"])
    op.create_index("ix_deliveries_key", "deliveries", ["key_id", "at"],
                    postgresql_where=sa.text("key_id IS NOT NULL"),
                    sqlite_where=sa.text("key_id IS NOT NULL"))
    op.create_index("ix_deliveries_event", "deliveries", ["integration_id", "event_id"],
                    postgresql_where=sa.text("event_id IS NOT NULL"),
                    sqlite_where=sa.text("event_id IS NOT NULL"))


def downgrade() -> None:
    """Drop the delivery log."""
    op.drop_table("deliveries")
