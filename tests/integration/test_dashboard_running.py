"""Work in flight: what each worker runs now, a live holder past its lease told apart from a
gone worker, throughput and queue age on the Overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask
from sqlalchemy import insert

from ledger.db.schema import attempts
from ledger.reads import throughput
from ledger.reads.throughput import read_throughput
from tests.dashboard_helpers import add_receipt, fast_hashes, logged_in
from tests.helpers import make_sender
from tests.integration.test_ops_dashboard import _instance, _job_state

__all__ = ["fast_hashes"]


def seed_in_flight(app: Flask) -> None:
    """A 300 s handler on a live worker, past its 60 s lease; a job of a gone worker;
    a due job behind them; three completions in the last minutes."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    sender = make_sender(app)
    _instance(app, "w:1:live", "worker", age=1)
    for event_id, worker, started in (("evt_slow", "w:1:live", 200), ("evt_gone", "gone:7:x",
                                                                      900)):
        add_receipt(app, sender.scope_id, event_id, state=0,
                    accepted_at=now - timedelta(seconds=started + 1))
        lease_end = now - timedelta(seconds=started - 60)
        _job_state(app, sender.scope_id, event_id, attempts=1, leased_by=worker,
                   leased_until=lease_end, run_at=lease_end)
        with svc.engine.begin() as conn:
            conn.execute(insert(attempts).values(
                scope_id=sender.scope_id, event_id=event_id, number=1, worker_id=worker,
                lease_token=1, started_at=now - timedelta(seconds=started)))
    add_receipt(app, sender.scope_id, "evt_waiting", state=0,
                accepted_at=now - timedelta(minutes=5))
    _job_state(app, sender.scope_id, "evt_waiting", run_at=now - timedelta(minutes=5))
    with svc.engine.begin() as conn:
        for i in range(3):
            at = now - timedelta(minutes=i + 1)
            conn.execute(insert(attempts).values(
                scope_id=sender.scope_id, event_id=f"evt_done_{i}", number=1, worker_id="w:1:live",
                lease_token=1, started_at=at, finished_at=at, outcome="complete"))


def test_stuck_shows_running_now_and_the_live_holder(app: Flask) -> None:
    seed_in_flight(app)
    page = logged_in(app, "viewer").get("/stuck").get_data(as_text=True)
    running, rest = page.split('id="stuck-table"')
    assert "evt_slow" in running and "w:1:live" in running and "past its lease by 2m" in running
    assert "3m 20s" in running  # running for
    assert "evt_gone" not in running
    slow = rest.split(">evt_slow<")[1].split("</tr>")[0]
    assert "held by live worker w:1:live past its lease" in slow
    gone = rest.split(">evt_gone<")[1].split("</tr>")[0]
    assert "lease expired, not retaken" in gone


def test_receipt_says_running_not_waiting(app: Flask) -> None:
    seed_in_flight(app)
    viewer = logged_in(app, "viewer")
    page = viewer.get("/credentials").get_data(as_text=True)
    public_id = page.split("/credentials/in_")[1].split('"')[0]
    slow = viewer.get(f"/receipts/in_{public_id}/evt_slow").get_data(as_text=True)
    assert "running now" in slow and "waiting for a worker" not in slow
    gone = viewer.get(f"/receipts/in_{public_id}/evt_gone").get_data(as_text=True)
    assert "is gone" in gone and "running now" not in gone
    assert "its worker stopped" in gone


def test_overview_shows_throughput_and_queue_age(app: Flask) -> None:
    seed_in_flight(app)
    page = logged_in(app, "viewer").get("/").get_data(as_text=True)
    card = page.split('id="throughput"')[1].split("</div>")[0]
    assert "completed / min" in card and "0.0" not in card.split("completed")[0]
    assert "waited 14m" in card  # evt_gone, due since its lease ended
    assert "now (UTC)" in card and 'class="axis-line"' in card


def _attempt(app: Flask, number: int, finished: datetime, outcome: str) -> None:
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(insert(attempts).values(
            scope_id=1, event_id=f"evt_{number}", number=1, worker_id="w:1:live",
            lease_token=1, started_at=finished - timedelta(seconds=1), finished_at=finished,
            outcome=outcome))


def test_throughput_counts_completions_per_minute(app: Flask) -> None:
    now = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
    for i, (minutes_ago, outcome) in enumerate([(1, "complete"), (1, "complete"),
                                                (1, "retry"), (3, "complete"),
                                                (3, "failed"), (40, "complete")]):
        _attempt(app, i, now - timedelta(minutes=minutes_ago), outcome)
    with app.extensions["ledger"].engine.connect() as conn:
        work = read_throughput(conn, now)
    per_minute = dict(work.per_minute)
    assert per_minute[datetime(2026, 11, 30, 11, 59, tzinfo=UTC)] == 2
    assert per_minute[datetime(2026, 11, 30, 11, 57, tzinfo=UTC)] == 1
    assert sum(n or 0 for n in per_minute.values()) == 3  # the 40-minute-old one is outside
    assert work.covered_from == datetime(2026, 11, 30, 11, 45, tzinfo=UTC)


def test_throughput_says_which_minutes_its_sample_did_not_reach(
        app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "SAMPLE_ROWS", 3)
    now = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
    for i, minutes_ago in enumerate([10, 5, 4, 2]):  # the oldest is beyond the sample
        _attempt(app, i, now - timedelta(minutes=minutes_ago), "complete")
    with app.extensions["ledger"].engine.connect() as conn:
        work = read_throughput(conn, now)
    per_minute = dict(work.per_minute)
    assert work.covered_from == now - timedelta(minutes=5, seconds=1)
    assert per_minute[datetime(2026, 11, 30, 11, 50, tzinfo=UTC)] is None
    assert [per_minute[datetime(2026, 11, 30, 11, m, tzinfo=UTC)] for m in (56, 58)] == [1, 1]
