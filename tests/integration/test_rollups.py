"""Rollups for the dashboard (jobs/rollups.py), both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from jobs.rollups import refresh
from ledger.clock import FixedClock
from ledger.db.schema import hourly_series, receipts, scope_counts
from ledger.domain import JobStatus, ReceiptState
from ledger.metrics.export import render_metrics
from tests.helpers import make_sender
from tests.integration.ledger_rows import add_receipt

NOW = datetime(2026, 6, 1, 12, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _two_scopes(app):
    """Scope A: 3 complete, 2 pending, 1 failed; scope B: 1 complete."""
    svc = app.extensions["ledger"]
    a = make_sender(app, account="acme").scope_id
    b = make_sender(app, account="globex").scope_id
    with svc.engine.begin() as conn:
        for i in range(3):
            add_receipt(conn, a, f"c{i}", state=ReceiptState.COMPLETE,
                        accepted_at=NOW - timedelta(minutes=10 + i))
        add_receipt(conn, a, "p-old", state=ReceiptState.PENDING,
                    accepted_at=NOW - 2 * HOUR, job=JobStatus.QUEUED)
        add_receipt(conn, a, "p-new", state=ReceiptState.PENDING,
                    accepted_at=NOW - timedelta(minutes=1), job=JobStatus.QUEUED)
        add_receipt(conn, a, "f", state=ReceiptState.FAILED, accepted_at=NOW - 3 * HOUR,
                    job=JobStatus.FAILED)
        add_receipt(conn, b, "c", state=ReceiptState.COMPLETE, accepted_at=NOW - 5 * HOUR)
    return svc, a, b


def test_scope_counts_hold_counts_per_scope_and_state_with_the_oldest_pending(app):
    svc, a, b = _two_scopes(app)
    refresh(svc.engine, FixedClock(NOW))
    with svc.engine.connect() as conn:
        rows = {(r.scope_id, r.state): r for r in conn.execute(select(scope_counts))}
    counts = {key: row.count for key, row in rows.items()}
    assert counts == {(a, 1): 3, (a, 0): 2, (a, 2): 1, (b, 1): 1}
    assert rows[(a, 0)].oldest_accepted_at == NOW - 2 * HOUR
    assert all(row.refreshed_at == NOW for row in rows.values())
    exposition = render_metrics(svc.engine, FixedClock(NOW), revocation_bound_seconds=30)[0]
    lines = exposition.decode().splitlines()
    assert 'ledger_receipts{state="pending"} 2.0' in lines
    assert 'ledger_receipts{state="complete"} 4.0' in lines
    assert "ledger_oldest_pending_seconds 7200.0" in lines


def test_hourly_series_counts_accepted_and_failed_per_hour(app):
    svc, a, b = _two_scopes(app)
    with svc.engine.begin() as conn:  # the failed receipt failed an hour after acceptance
        conn.execute(update(receipts).where(receipts.c.event_id == "f")
                     .values(completed_at=NOW - 2 * HOUR))
    refresh(svc.engine, FixedClock(NOW))
    this_hour = NOW.replace(minute=0)
    with svc.engine.connect() as conn:
        series = {(r.scope_id, r.hour): (r.accepted, r.failed)
                  for r in conn.execute(select(hourly_series))}
    assert series == {
        (a, this_hour): (4, 0),            # c0..c2 and p-new
        (a, this_hour - 2 * HOUR): (1, 1),  # p-old accepted; f failed in this hour
        (a, this_hour - 3 * HOUR): (1, 0),  # f accepted
        (b, this_hour - 5 * HOUR): (1, 0),
    }


def test_series_refresh_is_incremental_and_forgets_hours_past_the_window(app):
    svc, a, _ = _two_scopes(app)
    clock = FixedClock(NOW)
    refresh(svc.engine, clock)
    with svc.engine.begin() as conn:  # a write into an hour the band has settled is not read ...
        add_receipt(conn, a, "late", state=ReceiptState.COMPLETE, accepted_at=NOW - 5 * HOUR)
    clock.advance(60)
    refresh(svc.engine, clock)
    five_ago = NOW.replace(minute=0) - 5 * HOUR
    with svc.engine.connect() as conn:
        old = conn.execute(select(hourly_series.c.accepted).where(
            hourly_series.c.scope_id == a, hourly_series.c.hour == five_ago)).all()
    assert old == []
    clock.advance(3600)  # ... until a full recount (a pause over the purge margin forces one)
    refresh(svc.engine, clock)
    with svc.engine.connect() as conn:
        old = conn.execute(select(hourly_series.c.accepted).where(
            hourly_series.c.scope_id == a, hourly_series.c.hour == five_ago)).scalars().all()
    assert old == [1]
    clock.advance(8 * 24 * 3600)  # past the 7-day window
    refresh(svc.engine, clock)
    with svc.engine.connect() as conn:
        assert conn.execute(select(hourly_series)).all() == []
