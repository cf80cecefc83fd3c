"""A database older than the ledger's SQL needs is refused at once, by name, both engines.

The rollups bin hours with `date_bin` (PostgreSQL 14) and the claims use RETURNING (SQLite
3.35): on an older server they would fail later, job by job, with a syntax error. Here the
minimum is raised above what this machine runs, so the refusal is the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.db import engine as engines
from ledger.errors import UnsupportedDatabase
from tests.conftest import VIA_PGBOUNCER, _settings


def test_a_database_older_than_the_ledger_needs_is_refused_by_name(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(db_url, tmp_path).with_(db_pgbouncer=VIA_PGBOUNCER)
    current = engines.make_engine(settings)  # this machine's versions are supported
    with current.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    current.dispose()
    if db_url.startswith("sqlite"):
        monkeypatch.setattr(engines, "MIN_SQLITE", (99, 0, 0))
        with pytest.raises(UnsupportedDatabase, match=r"SQLite 3\.\d+\.\d+ is too old .*"
                           r"needs SQLite 99\.0\.0 or later"):
            engines.make_engine(settings)
        return
    monkeypatch.setattr(engines, "MIN_POSTGRES", 990000)
    old = engines.make_engine(settings)
    try:
        with pytest.raises(UnsupportedDatabase,
                           match=r"PostgreSQL \d+ is too old .*needs PostgreSQL 99 or later"):
            old.connect()
    finally:
        old.dispose()
