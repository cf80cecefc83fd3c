"""Migration 0002_tokens: tokens issued before it keep working, read-only, for 90 more days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, select

from ledger.access.operators import operator_for_token, token_digest
from ledger.db.schema import api_tokens, operators
from tests.helpers import migrate_to


def test_existing_tokens_become_read_only_and_expire_90_days_after_migration(
        empty_engine: Engine) -> None:
    engine = empty_engine
    migrate_to(engine, "0001")
    created = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as conn:
        # Only the columns 0001 has: the rows look exactly like pre-0002 tokens.
        conn.execute(insert(operators).values(username="robot", role="admin",
                                              password_hash="x", created_at=created))
        for n in range(2):
            conn.execute(insert(api_tokens).values(
                operator_id=1, token_sha256=token_digest(f"rlt_old{n}"),
                created_at=created))
    before = datetime.now(UTC)
    migrate_to(engine, "head")
    after = datetime.now(UTC)
    with engine.connect() as conn:
        rows = conn.execute(select(api_tokens)).all()
    assert len(rows) == 2
    assert {r.scopes for r in rows} == {"read"}
    assert len({r.public_id for r in rows}) == 2
    assert all(r.public_id.startswith("tok_") and len(r.public_id) == 26 for r in rows)
    for row in rows:
        assert before + timedelta(days=90) - timedelta(seconds=1) <= row.expires_at
        assert row.expires_at <= after + timedelta(days=90)
    with engine.begin() as conn:
        operator = operator_for_token(conn, "rlt_old0", datetime.now(UTC))
        expired = operator_for_token(conn, "rlt_old0", after + timedelta(days=91))
    # The migrated token still authenticates, read-only, until its new expiry.
    assert operator is not None and operator.token_scopes == ("read",)
    assert expired is None
