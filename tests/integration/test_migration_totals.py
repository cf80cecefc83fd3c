"""Migration 0025_hourly_totals: the ledger's hourly totals start as the series summed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, select

from ledger.db.schema import hourly_series, hourly_totals
from tests.helpers import migrate_to


def test_upgrade_fills_the_totals_from_the_series_already_kept(empty_engine: Engine) -> None:
    engine = empty_engine
    migrate_to(engine, "0024_sender_tokens")
    hour = datetime(2026, 11, 30, 12, tzinfo=UTC)
    with engine.begin() as conn:
        for scope in (1, 2, 3):
            for back in range(2):
                conn.execute(insert(hourly_series).values(
                    scope_id=scope, hour=hour - timedelta(hours=back),
                    accepted=10 * scope + back, failed=scope, settled=0,
                    refreshed_at=hour))
    migrate_to(engine, "head")
    with engine.connect() as conn:
        totals = {r.hour: (r.accepted, r.failed) for r in conn.execute(select(hourly_totals))}
    assert totals == {hour: (60, 6), hour - timedelta(hours=1): (63, 6)}
