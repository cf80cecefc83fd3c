"""Incident evidence: what the dashboard needs to answer an on-call engineer's questions.

- credentials.label: an operator's optional name for a key.
- ix_audit_action: the newest row of one action (the last drill run, a page's latest
  revocations) without scanning the whole audit log.
- conflict_bodies: the opt-in forensic window (LEDGER_CONFLICT_BODY_SECONDS) keeps the
  original body of completed receipts apart from their jobs, purged when it expires.
- requeue_members: the receipts of each bulk requeue, for its follow-through counts.
- revocation_refreshes: each live web instance's first credential refresh seen after a
  revocation (the per-revocation propagation evidence).

Revision ID: 0022_incident_evidence
Revises: 0021_destinations
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# schema.UTCDateTime's DDL (the migration never imports live code).
UTC_DATETIME = sa.DateTime(timezone=True)

revision = "0022_incident_evidence"
down_revision = "0021_destinations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the column, the indexes and the tables."""
    op.add_column("credentials", sa.Column("label", sa.Text))
    op.create_index("ix_audit_action", "audit_log", ["action", "id"])
    op.create_table(
        "conflict_bodies",
        sa.Column("scope_id", sa.Integer, primary_key=True),
        sa.Column("event_id", sa.Text, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("kept_at", UTC_DATETIME, nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=False),
    )
    op.create_index("ix_conflict_bodies_expires", "conflict_bodies", ["expires_at"])
    op.create_table(
        "requeue_members",
        sa.Column("batch_id", sa.Text, primary_key=True),
        sa.Column("scope_id", sa.Integer, primary_key=True),
        sa.Column("event_id", sa.Text, primary_key=True),
        sa.Column("requeued_at", UTC_DATETIME, nullable=False),
    )
    op.create_index("ix_requeue_members_at", "requeue_members", ["requeued_at"])
    op.create_table(
        "revocation_refreshes",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("instance_id", sa.Text, primary_key=True),
        sa.Column("refreshed_at", UTC_DATETIME, nullable=False),
        sa.Column("seen_at", UTC_DATETIME, nullable=False),
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_table("revocation_refreshes")
    op.drop_index("ix_requeue_members_at", table_name="requeue_members")
    op.drop_table("requeue_members")
    op.drop_index("ix_conflict_bodies_expires", table_name="conflict_bodies")
    op.drop_table("conflict_bodies")
    op.drop_index("ix_audit_action", table_name="audit_log")
    with op.batch_alter_table("credentials") as batch:
        batch.drop_column("label")
