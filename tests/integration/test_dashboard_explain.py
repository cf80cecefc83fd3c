"""EXPLAIN on PostgreSQL: the dashboard's hot list queries use their indexes, never a
sequential scan of receipts. Runs the exact SQL the query functions produce."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from ledger.domain import ReceiptState
from ledger.reads.admin import AuditFilter, list_audit, list_conflicts
from ledger.reads.groups import window_stmt as window_groups_stmt
from ledger.reads.receipts import (
    ReceiptFilter,
    open_receipts_stmt,
    prefix_stmt,
    window_stmt,
)
from ledger.reads.work import failures_chunk, stuck_pending
from tests.integration.pg_filled import filled_pg_ledger, insert_integrations

pytestmark = pytest.mark.postgres_only

ROWS = 20_000
SCOPES = 50
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def big_ledger(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
               ) -> Any:
    """A PostgreSQL ledger with 20k receipts in arrival order over 50 scopes, analysed."""
    yield from filled_pg_ledger(request, tmp_path_factory.mktemp("explain"), _fill_big_ledger)


def _fill_big_ledger(conn: Connection) -> None:
    """20k receipts in arrival order over 50 scopes, their failures' groups, 5,000 conflicts."""
    insert_integrations(conn, SCOPES, NOW)
    # One receipt a minute, oldest first (arrival order, as the intake writes them):
    # 3 % failed, 1 % pending, the rest complete.
    conn.execute(text(
        "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, "
        "event_id, event_type, body_sha256, result_ref) "
        "SELECT :now - make_interval(mins => :n - g), :now - make_interval(mins => :n - g),"
        " 1 + g % :scopes, CASE WHEN g % 33 = 0 THEN 2 WHEN g % 97 = 0 THEN 0 ELSE 1 END,"
        " 1, 'evt_' || md5(g::text), 'demo.credit', decode(md5(g::text), 'hex'), 'ok' "
        "FROM generate_series(1, :n) g"), {"now": NOW, "n": ROWS, "scopes": SCOPES})
    conn.execute(text(  # each failure's stored group, as the worker records it
        "INSERT INTO failure_members (scope_id, event_id, group_id, failed_at) "
        "SELECT scope_id, event_id, 'g' || (scope_id % 3), completed_at FROM receipts "
        "WHERE state = 2"))
    conn.execute(text(
        "INSERT INTO conflicts (scope_id, event_id, kind, original_event_id, "
        "original_sha256, incoming_sha256, first_seen, last_seen, count) "
        "SELECT 1 + g % :scopes, 'evt_' || g, 'different_body', 'evt_' || g, "
        "'\\x01', '\\x02', :now - make_interval(mins => g), "
        "   :now - make_interval(mins => g), 1 FROM generate_series(1, 5000) g"),
        {"now": NOW, "scopes": SCOPES})


def _plan(engine: Engine, stmt: Any) -> str:
    """Return the EXPLAIN text of a SQLAlchemy statement, with its real bound values."""
    compiled = stmt.compile(dialect=engine.dialect,
                            compile_kwargs={"render_postcompile": True})
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).all()
    return "\n".join(r[0] for r in rows)


def _no_receipts_seq_scan(plan: str) -> None:
    """Fail when the plan reads the whole receipts table."""
    assert "Seq Scan on receipts" not in plan, plan


def test_failed_and_pending_lists_use_the_partial_index(big_ledger: Engine) -> None:
    for state in (ReceiptState.FAILED, ReceiptState.PENDING):
        first = _plan(big_ledger, open_receipts_stmt(ReceiptFilter(state=state), None, 51))
        later = _plan(big_ledger, open_receipts_stmt(
            ReceiptFilter(state=state, scope_id=7), (NOW - timedelta(days=3), 7, "evt_x"), 51))
        for plan in (first, later):
            assert "ix_receipts_open" in plan, plan
            _no_receipts_seq_scan(plan)


def test_time_windows_use_the_accepted_at_index(big_ledger: Engine) -> None:
    lo, hi = NOW - timedelta(hours=1), NOW
    for f in (ReceiptFilter(), ReceiptFilter(state=ReceiptState.COMPLETE, scope_id=3),
              ReceiptFilter(event_type="demo.credit")):
        plan = _plan(big_ledger, window_stmt(f, None, lo, hi, 51))
        assert "ix_receipts_accepted" in plan, plan
        _no_receipts_seq_scan(plan)


def test_event_id_prefix_uses_the_primary_key(big_ledger: Engine) -> None:
    every_scope = list(range(1, SCOPES + 1))
    for scope_ids, key in ((None, None), (every_scope, None), ([4], (4, "evt_a0")),
                           (None, (7, "evt_a0"))):
        plan = _plan(big_ledger, prefix_stmt(ReceiptFilter(prefix="evt_a"), scope_ids, key, 51))
        assert "pk_receipts" in plan, plan
        _no_receipts_seq_scan(plan)


def test_stuck_failures_conflicts_and_audit_lists_use_indexes(big_ledger: Engine) -> None:
    from ledger.db.schema import conflicts, receipts

    statements: list[Any] = []

    class Recorder:
        """Capture the statements a query function executes."""

        def __init__(self, conn: Any) -> None:
            self.conn = conn

        def execute(self, stmt: Any, *args: Any) -> Any:
            statements.append(stmt)
            return self.conn.execute(stmt, *args)

    with big_ledger.connect() as conn:
        recorder = Recorder(conn)
        stuck_pending(recorder, NOW, 900)  # type: ignore[arg-type]
        failures_chunk(recorder, ReceiptFilter(scope_id=5), None, 100)  # type: ignore[arg-type]
        list_conflicts(recorder, unacknowledged=True)  # type: ignore[arg-type]
        list_audit(recorder, AuditFilter())  # type: ignore[arg-type]
    receipt_reads = [s for s in statements if receipts in s.get_final_froms()]
    assert len(receipt_reads) == 2
    for stmt in receipt_reads:
        plan = _plan(big_ledger, stmt)
        assert "ix_receipts_open" in plan, plan
    conflict_reads = [s for s in statements if conflicts in s.get_final_froms()]
    assert "ix_conflicts_last_seen" in _plan(big_ledger, conflict_reads[0])


def test_an_account_filter_and_the_failure_groups_stay_on_indexes(big_ledger: Engine) -> None:
    account = ReceiptFilter(scope_ids=(3, 4, 5))
    lo, hi = NOW - timedelta(hours=1), NOW
    for plan in (_plan(big_ledger, window_stmt(account, None, lo, hi, 51)),
                 _plan(big_ledger, open_receipts_stmt(
                     ReceiptFilter(scope_ids=(3, 4, 5), state=ReceiptState.FAILED), None, 51)),
                 _plan(big_ledger, prefix_stmt(ReceiptFilter(prefix="evt_a", scope_ids=(3, 4)),
                                               [3, 4], None, 51))):
        _no_receipts_seq_scan(plan)
    # A time window's groups: the window's newest failures through the partial index,
    # joined to their stored groups (by key or, this table being small, by hash). A week:
    # over three days of this small ledger the btree on accepted_at is as cheap (4,300
    # rows, 94 buffers against 70) and the planner may take it; over a week it would
    # read every receipt of the window, and the partial index wins.
    with big_ledger.connect() as conn:
        stmt = window_groups_stmt(conn, ReceiptFilter(since=NOW - timedelta(days=7)), 5001)
    plan = _plan(big_ledger, stmt)
    assert "ix_receipts_open" in plan, plan
    _no_receipts_seq_scan(plan)
