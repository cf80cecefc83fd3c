"""Jobs keep the sender's Content-Type and a form sender's body as received.

A destination forwards the stored body as received with its Content-Type (CONTRACT
section 8). A JSON sender's `payload` is its body as received; a form sender's `payload`
is the decoded fields its handlers read, so its body as received is kept beside it in
`raw_body`. Both are NULL on jobs queued before this revision: those forward as
`application/json` with the payload, as before.

Revision ID: 0023_job_content_type
Revises: 0022_incident_evidence
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_job_content_type"
down_revision = "0022_incident_evidence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the two nullable columns (no rewrite of existing rows)."""
    op.add_column("jobs", sa.Column("content_type", sa.Text))
    op.add_column("jobs", sa.Column("raw_body", sa.Text))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("raw_body")
        batch.drop_column("content_type")
