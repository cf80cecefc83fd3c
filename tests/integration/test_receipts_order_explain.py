"""EXPLAIN ANALYZE on PostgreSQL: the newest-first receipt list and a time window stay cheap
after new receipts have gone into the free space of old pages (a purge, VACUUM, new intake),
the physical order that widened the old BRIN index's ranges to the whole table.

With the BRIN in place of the btree on this same ledger, the one-hour window was a
sequential scan of all 984 pages and the one-minute window read 221 (the btree: 3 and 4)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from ledger.domain import ReceiptState
from ledger.reads.receipts import ReceiptFilter, window_stmt
from tests.integration.pg_filled import filled_pg_ledger, insert_integrations

pytestmark = pytest.mark.postgres_only

OLD_ROWS = 60_000  # one every 10 s, the week before NEW_FROM
NEW_ROWS = 20_000  # the last hour, written after the purge and VACUUM
SCOPES = 50
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NEW_FROM = NOW - timedelta(hours=1)
# A page of 51 rows reads at most ~51 heap pages and a few index pages; the table is ~20x that.
MAX_BUFFERS = 200


@pytest.fixture(scope="module")
def widened_ledger(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
                   ) -> Any:
    """A ledger whose newest hour sits in the pages a purge of its oldest third emptied."""
    for engine in filled_pg_ledger(request, tmp_path_factory.mktemp("widened"), _fill_old):
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL statement_timeout = 0"))
            conn.execute(text(  # the retention purge of the oldest finished third
                "DELETE FROM receipts WHERE accepted_at < :cut AND state IN (1, 2)"),
                {"cut": NEW_FROM - timedelta(seconds=10 * OLD_ROWS * 2 // 3)})
        _vacuum(engine)
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL statement_timeout = 0"))
            _insert(conn, "evt_new_", NEW_ROWS, NEW_FROM, 0.18)
        _vacuum(engine)
        yield engine


def _fill_old(conn: Connection) -> None:
    """A week of receipts in arrival order, 3 % failed, the rest complete."""
    insert_integrations(conn, SCOPES, NOW)
    _insert(conn, "evt_old_", OLD_ROWS, NEW_FROM - timedelta(seconds=10 * OLD_ROWS), 10)


def _insert(conn: Connection, prefix: str, rows: int, start: datetime, step: float) -> None:
    """Insert `rows` receipts from `start`, one every `step` seconds, in arrival order."""
    conn.execute(text(
        "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, "
        "event_id, event_type, body_sha256, result_ref) "
        "SELECT :start + make_interval(secs => g * :step),"
        " :start + make_interval(secs => g * :step),"
        " 1 + g % :scopes, CASE WHEN g % 33 = 0 THEN 2 ELSE 1 END, 1, :prefix || md5(g::text),"
        " 'demo.credit', decode(md5(g::text), 'hex'), 'ok' FROM generate_series(1, :n) g"),
        {"start": start, "step": step, "scopes": SCOPES, "prefix": prefix, "n": rows})


def _vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE receipts"))


def _analyze(engine: Engine, stmt: Any) -> tuple[str, int]:
    """Return the plan text and the shared buffers (hit + read) the statement touched."""
    compiled = stmt.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    with engine.connect() as conn:
        raw = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + str(compiled),
                                   compiled.params).scalar_one()
        plan = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    top = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return "\n".join(r[0] for r in plan), top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_the_newest_hour_really_sits_in_old_pages(widened_ledger: Engine) -> None:
    with widened_ledger.connect() as conn:
        blocks = conn.execute(text(
            "SELECT min((ctid::text::point)[0]), max((ctid::text::point)[0]) FROM receipts "
            "WHERE accepted_at >= :new"), {"new": NEW_FROM}).one()
        pages = conn.execute(text("SELECT relpages FROM pg_class WHERE relname = 'receipts'")
                             ).scalar_one()
    # The new rows went into the emptied pages at the front, not onto the table's end.
    assert blocks[0] < pages * 0.1, (blocks, pages)
    assert pages > 4 * MAX_BUFFERS, pages


def test_newest_first_pages_and_an_hour_window_read_few_buffers(widened_ledger: Engine
                                                                ) -> None:
    newest = (NOW - timedelta(seconds=5), 7, "evt_new_x")
    old_hour = NEW_FROM - timedelta(days=1)
    cases = {
        "first window": window_stmt(ReceiptFilter(), None, NOW - timedelta(seconds=60),
                                    NOW + timedelta(hours=1), 51),
        "one hour": window_stmt(ReceiptFilter(), None, NEW_FROM, NOW, 51),
        "next page": window_stmt(ReceiptFilter(), newest, NEW_FROM, NOW, 51),
        "an old hour": window_stmt(ReceiptFilter(), None, old_hour - timedelta(hours=1),
                                   old_hour, 51),
        "complete ones": window_stmt(ReceiptFilter(state=ReceiptState.COMPLETE), None,
                                     NEW_FROM, NOW, 51),
    }
    for name, stmt in cases.items():
        plan, buffers = _analyze(widened_ledger, stmt)
        assert "ix_receipts_accepted" in plan, (name, plan)
        assert "Seq Scan on receipts" not in plan, (name, plan)
        assert buffers <= MAX_BUFFERS, (name, buffers, plan)
