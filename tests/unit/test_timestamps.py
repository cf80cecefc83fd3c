"""Timestamps read back outside a typed column (SQLite aggregates return text)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from ledger.db.timestamps import as_utc


def test_sqlite_text_and_driver_datetimes_become_aware_utc():
    expected = datetime(2026, 6, 1, 12, 0, 30, 250000, tzinfo=UTC)
    assert as_utc("2026-06-01 12:00:30.250000") == expected  # SQLite's naive UTC text
    assert as_utc(expected.replace(tzinfo=None)) == expected
    plus_two = expected.astimezone(timezone(timedelta(hours=2)))
    assert as_utc(plus_two.isoformat()).tzinfo is UTC
    assert as_utc(plus_two.isoformat()) == expected  # an offset is honoured, not overwritten
    assert as_utc(None) is None
