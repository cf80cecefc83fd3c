"""The signature tokens of senders whose signature does not cover the event (Mailgun).

Mailgun signs `{timestamp}{token}` only, so within the freshness window a captured
signature object could carry another event. Each token used is kept per consumer scope
with the event it carried until its signed timestamp leaves the window: the same token
with another event id or body is refused (CONTRACT section 2: 401), a genuine retry of the
same event is answered as a duplicate. The retention sweep drops rows past `expires_at`.

Revision ID: 0024_sender_tokens
Revises: 0023_job_content_type
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_sender_tokens"
down_revision = "0023_job_content_type"
branch_labels = None
depends_on = None

# schema.UTCDateTime's DDL (the migration never imports live code).
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the table and the index the sweep reads."""
    op.create_table(
        "sender_tokens",
        sa.Column("scope_id", sa.Integer, primary_key=True),
        sa.Column("token", sa.Text, primary_key=True),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("body_sha256", sa.LargeBinary(32), nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=False),
    )
    op.create_index("ix_sender_tokens_expires", "sender_tokens", ["expires_at"])


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_sender_tokens_expires", table_name="sender_tokens")
    op.drop_table("sender_tokens")
