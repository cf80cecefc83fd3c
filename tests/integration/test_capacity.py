"""Capacity measurement (ledger/capacity.py, `ledger capacity`), both databases."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from ledger.db.schema import receipts
from ledger.reads.capacity import measure
from tests.helpers import make_sender

ROWS = 5000


def _insert(svc, scope_id: int, start: int, n: int, now: datetime) -> None:
    """Insert n complete receipts, the first half accepted two days ago."""
    rows = [{"scope_id": scope_id, "event_id": f"evt_{i:020d}", "event_type": "demo.credit",
             "state": 1, "attempts": 1, "completed_at": now,
             "accepted_at": now - (timedelta(days=2) if i - start < n // 2 else timedelta(hours=1)),
             "body_sha256": hashlib.sha256(str(i).encode()).digest(), "result_ref": "credit:1"}
            for i in range(start, start + n)]
    with svc.engine.begin() as conn:
        conn.execute(receipts.insert(), rows)


def _allocated_bytes(conn) -> int:
    """Bytes the receipts table and its indexes occupy, counted another way."""
    if conn.dialect.name == "postgresql":
        # heap with its free-space and visibility maps and TOAST, plus every index
        return int(conn.execute(text(
            "SELECT pg_table_size('receipts') + pg_indexes_size('receipts')")).scalar_one())
    page = conn.execute(text("PRAGMA page_size")).scalar_one()
    return page * int(conn.execute(text(
        "SELECT count(*) FROM dbstat WHERE name IN "
        "(SELECT name FROM sqlite_master WHERE tbl_name = 'receipts')")).scalar_one())


def test_bytes_per_receipt_match_the_relation_size_over_the_rows(app):
    svc = app.extensions["ledger"]
    now = datetime.now(UTC)
    scope = make_sender(app).scope_id
    _insert(svc, scope, 0, ROWS, now)
    first = measure(svc.engine, svc.settings, now=now)
    assert set(first) == {"receipts", "bytes_per_receipt_measured", "retention_days",
                          "events_per_day", "projected_bytes"}
    assert first["receipts"] == ROWS and first["events_per_day"] == ROWS // 2
    with svc.engine.connect() as conn:
        allocated = _allocated_bytes(conn)
    assert first["bytes_per_receipt_measured"] == pytest.approx(allocated / ROWS, abs=0.1)
    # a receipt here holds a 24-char id, a 32-byte digest, two timestamps and the
    # primary key again in its index: well over 60 bytes, well under a kilobyte
    assert 60 < first["bytes_per_receipt_measured"] < 1000
    _insert(svc, scope, ROWS, ROWS, now)
    second = measure(svc.engine, svc.settings, now=now)
    assert second["receipts"] == 2 * ROWS
    ratio = second["bytes_per_receipt_measured"] / first["bytes_per_receipt_measured"]
    assert 0.7 < ratio < 1.3  # a per-row figure, not a total
    assert second["projected_bytes"] == round(
        second["events_per_day"] * second["retention_days"]
        * second["bytes_per_receipt_measured"])


def test_capacity_command_prints_the_contract_keys_and_replicas_only_when_asked(app, runner):
    svc = app.extensions["ledger"]
    empty = json.loads(runner.invoke(args=["ledger", "capacity", "--json"]).output)
    assert empty["receipts"] == 0 and empty["bytes_per_receipt_measured"] is None
    _insert(svc, make_sender(app).scope_id, 0, 200, datetime.now(UTC))
    out = runner.invoke(args=["ledger", "capacity", "--json"])
    assert out.exit_code == 0, out.output
    plain = json.loads(out.output)
    assert list(plain) == ["receipts", "bytes_per_receipt_measured", "retention_days",
                           "events_per_day", "projected_bytes"]
    assert plain["retention_days"] == round(605_100 / 86400, 4)
    doubled = json.loads(runner.invoke(
        args=["ledger", "capacity", "--replicas", "2", "--json"]).output)
    assert doubled["replicas"] == 2
    assert doubled["projected_bytes"] == pytest.approx(2 * plain["projected_bytes"], abs=2)
    bad = runner.invoke(args=["ledger", "capacity", "--replicas", "0", "--json"])
    assert bad.exit_code == 2


def test_pages_read_the_counts_from_the_rollups_once_they_have_run(app):
    """The dashboard's figures come from the rollups (no count of the table per view)."""
    from jobs.rollups import refresh
    from ledger.clock import FixedClock

    svc = app.extensions["ledger"]
    now = datetime.now(UTC)
    scope = make_sender(app).scope_id
    _insert(svc, scope, 0, 100, now)
    assert measure(svc.engine, svc.settings, now=now, from_rollups=True)["receipts"] == 100
    refresh(svc.engine, FixedClock(now))
    _insert(svc, scope, 100, 10, now)  # after the run: the exact count sees them at once
    paged = measure(svc.engine, svc.settings, now=now, from_rollups=True)
    exact = measure(svc.engine, svc.settings, now=now)
    assert (paged["receipts"], paged["events_per_day"]) == (100, 50)
    assert (exact["receipts"], exact["events_per_day"]) == (110, 55)
