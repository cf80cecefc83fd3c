"""A migrated database per test: the ledger's schema (ledger.testing) plus Acme's tables.

SQLite always; PostgreSQL too when ACME_TEST_POSTGRES_URL names a server to create
throwaway databases on (e.g. postgresql://postgres@127.0.0.1/postgres).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ledger.testing import LedgerDatabase, ledger_database

from acme_handlers.migrate import upgrade

POSTGRES_URL = os.environ.get("ACME_TEST_POSTGRES_URL")


@pytest.fixture(params=["sqlite", *(["postgresql"] if POSTGRES_URL else [])])
def db(request: pytest.FixtureRequest) -> Iterator[LedgerDatabase]:
    """Yield a ledger database with Acme's migrations applied."""
    with ledger_database(POSTGRES_URL if request.param == "postgresql" else None) as database:
        upgrade(database.engine)  # Acme's tables, under Acme's own version table
        yield database
