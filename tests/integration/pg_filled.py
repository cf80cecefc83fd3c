"""A fresh PostgreSQL ledger filled by a test module's own SQL and analysed: the EXPLAIN tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, text

from ledger.config import Settings
from ledger.db.engine import make_engine
from tests.conftest import _pg_database


def filled_pg_ledger(request: pytest.FixtureRequest, tmp: Path,
                     fill: Callable[[Connection], None]) -> Iterator[Engine]:
    """Yield an engine on a fresh migrated database that `fill` loaded in one transaction.

    Loading is given all the time it needs (a loaded machine can pass the default statement
    timeout); ANALYZE runs before the engine is handed over; the database is dropped after.
    """
    admin = request.getfixturevalue("pg_admin_url")
    template = request.getfixturevalue("pg_template")
    if admin is None or template is None:
        pytest.skip("PostgreSQL unavailable on this machine (never skipped in CI)")
    for url in _pg_database(admin, template):
        engine = make_engine(Settings(database_url=url, var_dir=tmp))
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL statement_timeout = 0"))
            fill(conn)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
        yield engine
        engine.dispose()


def insert_integrations(conn: Connection, count: int, now: datetime) -> None:
    """Add `count` Stripe integrations, ids 1..count, accounts acct1..acctN."""
    conn.execute(text(
        "INSERT INTO integrations (public_id, account, name, profile, "
        "tolerance_seconds, sandbox, created_at) SELECT 'in_' || lpad(g::text, 22, '0'),"
        " 'acct' || g, 'stripe', 'stripe', 300, false, :now "
        "FROM generate_series(1, :n) g"), {"now": now, "n": count})
