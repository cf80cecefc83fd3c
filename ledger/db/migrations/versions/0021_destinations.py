"""Destinations: forward an integration's accepted events over HTTP (CONTRACT section 8).

`destinations` holds each endpoint, its settings and the backoff state every worker
shares; `destination_secrets` its `whsec_` signing secrets (encrypted like credentials);
`destination_attempts` what the endpoint answered to each attempt of a receipt.

Revision ID: 0021_destinations
Revises: 0020_instance_handles
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_destinations"
down_revision = "0020_instance_handles"
branch_labels = None
depends_on = None

# The live schema's UTCDateTime stores this type (migrations never import live code).
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create destinations, destination_secrets and destination_attempts."""
    op.create_table(
        "destinations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("public_id", sa.Text, nullable=False, unique=True),
        sa.Column("integration_id", sa.Integer, nullable=False, index=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("event_types", sa.Text),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("state_reason", sa.Text),
        sa.Column("state_changed_at", UTC_TIME, nullable=False),
        sa.Column("timeout_seconds", sa.Float, nullable=False),
        sa.Column("max_in_flight", sa.Integer, nullable=False),
        sa.Column("rate_per_second", sa.Float),
        sa.Column("consecutive_failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("blocked_until", UTC_TIME),
        sa.Column("next_send_at", UTC_TIME),
        sa.Column("created_at", UTC_TIME, nullable=False),
    )
    op.create_table(
        "destination_secrets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("destination_id", sa.Integer, nullable=False, index=True),
        sa.Column("secret_enc", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME),
    )
    op.create_table(
        "destination_attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("destination_id", sa.Integer, nullable=False),
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("started_at", UTC_TIME, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("http_status", sa.SmallInteger),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("response_excerpt", sa.Text),
    )
    op.create_index("ix_destination_attempts_receipt", "destination_attempts",
                    ["scope_id", "event_id", "number"])
    op.create_index("ix_destination_attempts_started", "destination_attempts",
                    ["destination_id", "started_at"])


def downgrade() -> None:
    """Drop the destination tables."""
    op.drop_table("destination_attempts")
    op.drop_table("destination_secrets")
    op.drop_table("destinations")
