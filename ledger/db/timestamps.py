"""Timestamps that come back from the database outside a typed column.

A `UTCDateTime` column converts its values itself; an aggregate over one
(`min(accepted_at)`) does not: PostgreSQL still returns an aware datetime, SQLite
returns the stored naive-UTC text. Every such value goes through `as_utc`.
"""

from __future__ import annotations

from datetime import UTC, datetime


def as_utc(moment: datetime | str | None) -> datetime | None:
    """Return an aware UTC datetime from a driver's datetime or SQLite's text (naive = UTC)."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
