"""Incident evidence: what the dashboard needs to answer an on-call engineer's questions.

- ix_audit_action: the newest row of one action (the last drill run, a page's latest
  revocations) without scanning the whole audit log.

Revision ID: 0022_incident_evidence
Revises: 0019_jobs_scope_due
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0022_incident_evidence"
down_revision = "0019_jobs_scope_due"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the index."""
    op.create_index("ix_audit_action", "audit_log", ["action", "id"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("ix_audit_action", table_name="audit_log")
