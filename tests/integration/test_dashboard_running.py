"""Work in flight: what each worker runs now, a live holder past its lease told apart from a
gone worker, throughput and queue age on the Overview."""

from __future__ import annotations

from datetime import timedelta

from flask import Flask
from sqlalchemy import insert

from ledger.db.schema import attempts
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
