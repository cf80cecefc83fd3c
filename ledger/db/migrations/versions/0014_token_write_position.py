"""API tokens remember the primary's WAL position after their last write, so a script's
read after its own write is not served by a replica that has not replayed it yet
(README "A read replica").

Revision ID: 0014_token_write_position
Revises: 0013_sweep_marks
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_token_write_position"
down_revision = "0013_sweep_marks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add api_tokens.wrote_at (a pg_lsn as text; NULL until the token's first write)."""
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("wrote_at", sa.Text))


def downgrade() -> None:
    """Drop api_tokens.wrote_at."""
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("wrote_at")
