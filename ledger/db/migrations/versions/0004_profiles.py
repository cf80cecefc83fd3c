"""Profile settings per integration: type path, fixed type, endpoint URL, hmac options.

Revision ID: 0004_profiles
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_profiles"
down_revision = "0003_scheduler_run_leases"
branch_labels = None
depends_on = None

COLUMNS = ("type_path", "fixed_event_type", "endpoint_url", "hmac_options")


def upgrade() -> None:
    """Add the nullable settings columns; existing integrations keep their behaviour."""
    with op.batch_alter_table("integrations") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Text, nullable=True))


def downgrade() -> None:
    """Drop the settings columns."""
    with op.batch_alter_table("integrations") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
