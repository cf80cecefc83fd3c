"""Migration 0025_hourly_totals: the ledger's hourly totals start as the series summed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, select

from ledger.config import Settings
from ledger.db.engine import make_engine
from ledger.db.schema import hourly_series, hourly_totals
from tests.conftest import TEST_MASTER_KEY
from tests.helpers import migrate_to


def test_upgrade_fills_the_totals_from_the_series_already_kept(
        empty_db_url: str, tmp_path: Path) -> None:
    engine = make_engine(Settings(database_url=empty_db_url, var_dir=tmp_path,
                                  master_key=TEST_MASTER_KEY))
    try:
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
    finally:
        engine.dispose()
