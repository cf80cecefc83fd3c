"""API tokens get a public id, scopes and an expiry; sessions count password re-entries.

Existing tokens keep working, but only as they are safest: read-only (`read`), expiring
90 days after this migration, each with a fresh public `tok_…` id (README "API tokens").

Revision ID: 0002_tokens
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import secrets
import string
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0002_tokens"
down_revision = "0001"
branch_labels = None
depends_on = None

MIGRATED_TOKEN_DAYS = 90
# ledger.ids as of this revision: a migration never imports live code.
_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def new_token_id() -> str:
    """Return a fresh public API token id (`tok_` + 22 base62 characters)."""
    return "tok_" + "".join(secrets.choice(_BASE62) for _ in range(22))


def upgrade() -> None:
    """Add token scopes, expiry and public id; add the per-session re-entry counter."""
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("public_id", sa.Text))
        batch.add_column(sa.Column("scopes", sa.Text, nullable=False, server_default="read"))
        batch.add_column(sa.Column("expires_at", UTCDateTime))
    tokens = sa.table("api_tokens", sa.column("id", sa.Integer),
                      sa.column("public_id", sa.Text), sa.column("expires_at", UTCDateTime))
    conn = op.get_bind()
    expires = datetime.now(UTC) + timedelta(days=MIGRATED_TOKEN_DAYS)
    for (token_id,) in conn.execute(sa.select(tokens.c.id)).all():
        conn.execute(sa.update(tokens).where(tokens.c.id == token_id)
                     .values(public_id=new_token_id(), expires_at=expires))
    with op.batch_alter_table("api_tokens") as batch:
        batch.alter_column("public_id", existing_type=sa.Text, nullable=False)
        batch.alter_column("expires_at", existing_type=UTCDateTime, nullable=False)
        batch.create_unique_constraint("uq_api_tokens_public_id", ["public_id"])
    with op.batch_alter_table("operator_sessions") as batch:
        batch.add_column(sa.Column("reauth_failures", sa.Integer, nullable=False,
                                   server_default="0"))


def downgrade() -> None:
    """Drop the columns again (tokens lose their scopes and expiry)."""
    with op.batch_alter_table("operator_sessions") as batch:
        batch.drop_column("reauth_failures")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_constraint("uq_api_tokens_public_id", type_="unique")
        batch.drop_column("expires_at")
        batch.drop_column("scopes")
        batch.drop_column("public_id")
