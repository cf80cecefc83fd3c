"""EXPLAIN on PostgreSQL: the delivery log's reads use their indexes, never a sequential scan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from jobs.rollup_deliveries import settled_rows_stmt
from ledger.reads.deliveries import DeliveryFilter, deliveries_stmt, event_deliveries_stmt
from tests.integration.pg_filled import filled_pg_ledger
from tests.integration.test_dashboard_explain import _plan

pytestmark = pytest.mark.postgres_only

ROWS = 100_000
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
KEY = "key_" + "0" * 21 + "7"


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    """A PostgreSQL delivery log of 100k rows over 50 integrations and 500 keys, analysed."""
    yield from filled_pg_ledger(request, tmp_path_factory.mktemp("dlog"), _fill_log)


def _fill_log(conn: Connection) -> None:
    """100k deliveries a second apart, a tenth of them refused, over 50 integrations."""
    conn.execute(text(
        "INSERT INTO deliveries (at, integration_id, public_id, outcome, http_status,"
        " key_id, event_id, client, reason, count)"
        " SELECT :now - make_interval(secs => :n - g), 1 + g % 50, NULL,"
        " CASE WHEN g % 10 = 0 THEN 'unauthenticated' ELSE 'accepted' END,"
        " CASE WHEN g % 10 = 0 THEN 401 ELSE 202 END,"
        " 'key_' || lpad((g % 500)::text, 22, '0'), 'evt_' || g, '10.0.0.1', NULL, 1"
        " FROM generate_series(1, :n) g"), {"now": NOW, "n": ROWS})


def _uses_index(plan: str, index: str) -> None:
    assert index in plan, plan
    assert "Seq Scan on deliveries" not in plan, plan


def test_delivery_lists_use_their_indexes(big_log: Engine) -> None:
    later = (NOW - timedelta(hours=3), 5)
    _uses_index(_plan(big_log, deliveries_stmt(DeliveryFilter(), None, 51)), "ix_deliveries_at")
    for outcome in ("unauthenticated", "internal"):  # a tenth of the log; none of it
        _uses_index(_plan(big_log, deliveries_stmt(DeliveryFilter(outcome=outcome), later, 51)),
                    "ix_deliveries_outcome")
    _uses_index(_plan(big_log, deliveries_stmt(DeliveryFilter(outcome="accepted"), None, 51)),
                "ix_deliveries_at")
    _uses_index(_plan(big_log, deliveries_stmt(
        DeliveryFilter(since=NOW - timedelta(hours=5), until=NOW - timedelta(hours=4)),
        later, 51)), "ix_deliveries_at")
    _uses_index(_plan(big_log, deliveries_stmt(DeliveryFilter(integration_id=7), later, 51)),
                "ix_deliveries_integration")
    # Integration and outcome: the planner picks either index (never a scan of the log).
    both = _plan(big_log, deliveries_stmt(DeliveryFilter(integration_id=7, outcome="internal"),
                                          None, 51))
    assert "ix_deliveries_integration" in both or "ix_deliveries_outcome" in both, both
    assert "Seq Scan on deliveries" not in both, both
    _uses_index(_plan(big_log, deliveries_stmt(DeliveryFilter(key_id=KEY), None, 51)),
                "ix_deliveries_key")


def test_an_events_deliveries_use_the_event_index(big_log: Engine) -> None:
    _uses_index(_plan(big_log, event_deliveries_stmt(3, "evt_1002")), "ix_deliveries_event")


def test_the_delivery_hours_rollup_reads_only_what_settled(big_log: Engine) -> None:
    """A rollups run reads the minutes since the last one through the (at, id) index."""
    with big_log.connect() as conn:
        stmt = settled_rows_stmt(conn, NOW - timedelta(minutes=2), NOW - timedelta(minutes=1))
    _uses_index(_plan(big_log, stmt), "ix_deliveries_at")
