"""Per-integration delivery health: success rate, refusals and p95 intake latency as SVG."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from jobs.rollups import refresh
from ledger.clock import FixedClock
from ledger.db.schema import deliveries
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
)
from tests.helpers import deliver, make_sender

SETTLED = timedelta(minutes=5)  # past the delivery log's settle lag


def _log(app, scope_id, at, status, *, latency_us=None, count=1, times=1):  # type: ignore[no-untyped-def]
    """Write delivery log rows as the intake's flusher does."""
    outcome = {202: "accepted", 200: "duplicate", 409: "conflict", 401: "unauthenticated",
               400: "invalid_event", 413: "body_too_large", 404: "unknown_integration"}[status]
    with app.extensions["ledger"].engine.begin() as conn:
        conn.execute(insert(deliveries), [
            {"at": at, "integration_id": scope_id, "public_id": None, "outcome": outcome,
             "http_status": status, "key_id": None, "event_id": None, "client": "10.0.0.1",
             "reason": None, "count": count, "latency_us": latency_us}] * times)


def _health(viewer, sender) -> str:  # type: ignore[no-untyped-def]
    return viewer.get(f"/credentials/{sender.public_id}/health",
                      headers={"HX-Request": "true"}).get_data(as_text=True)


def test_health_shows_24h_and_7d_success_rates_from_the_rollup(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    other = make_sender(app, account="globex")
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    for i in range(8):
        add_receipt(app, sender.scope_id, f"evt_ok_{i}", state=1, accepted_at=now)
    for i in range(2):
        add_receipt(app, sender.scope_id, f"evt_bad_{i}", state=2, accepted_at=now)
    for i in range(10):  # three days ago: in the week, not in the day
        add_receipt(app, sender.scope_id, f"evt_old_{i}", state=1,
                    accepted_at=now - timedelta(days=3))
    add_receipt(app, other.scope_id, "evt_other", state=2, accepted_at=now)
    refresh(svc.engine, svc.clock, full_series=True)
    client = logged_in(app, "viewer")
    html = _health(client, sender)
    assert html.count("<svg") == 6  # volume, refusals and latency for each window
    assert "80.0 % succeeded" in html and "(10 accepted, 2 failed)" in html  # 24 h
    assert "90.0 % succeeded" in html and "(20 accepted, 2 failed)" in html  # 7 days
    assert "0 refused" in html and "no answered deliveries" in html  # no log rows yet
    empty = client.get(f"/credentials/{other.public_id}/health").get_data(as_text=True)
    assert "0.0 % succeeded" in empty
    assert client.get("/credentials/in_nope/health").status_code == 404
    page = client.get(f"/credentials/{sender.public_id}").get_data(as_text=True)
    assert f"/credentials/{sender.public_id}/health" in page


def test_health_shows_refusals_and_p95_latency_per_hour_and_per_day(app) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    other = make_sender(app, account="globex")
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    recent, old = now - timedelta(minutes=10), now - timedelta(days=3)
    _log(app, sender.scope_id, recent, 202, latency_us=5_000, times=94)
    _log(app, sender.scope_id, recent, 409, latency_us=700_000, times=6)
    _log(app, sender.scope_id, recent, 401, times=2)
    _log(app, sender.scope_id, recent, 401, count=5)  # a flood minute the log only counted
    _log(app, sender.scope_id, recent, 413)
    _log(app, sender.scope_id, recent, 400)
    _log(app, None, recent, 404, times=7)  # no integration to attribute these to
    _log(app, other.scope_id, recent, 401, times=3)
    _log(app, sender.scope_id, old, 200, latency_us=30_000, times=100)
    _log(app, sender.scope_id, old, 401, times=4)
    refresh(svc.engine, FixedClock(now + SETTLED))
    viewer = logged_in(app, "viewer")
    html = _health(viewer, sender)
    day, week = html.split('<figure class="health">')[1:3]
    assert "9 refused" in day and "p95 \u2264 768 ms</span> over 100 answered" in day
    # The week sums its hours' buckets: 194 of 200 answers are within 32 ms.
    assert "13 refused" in week and "p95 \u2264 32 ms</span> over 200 answered" in week
    hour = recent.replace(minute=0, second=0, microsecond=0)
    assert f"{hour:%Y-%m-%d %H:%M} UTC: 9 refused" in day
    assert f"{hour:%Y-%m-%d %H:%M} UTC: p95 \u2264 768 ms (100 answered)" in day
    current = now.replace(minute=0, second=0, microsecond=0)
    week_start = current - timedelta(days=7) + timedelta(hours=1)  # days end with this hour
    day_start = week_start + (old - week_start) // timedelta(days=1) * timedelta(days=1)
    assert f"{day_start:%Y-%m-%d} UTC: p95 \u2264 32 ms (100 answered)" in week
    assert "3 refused" in _health(viewer, other)


def test_the_intake_records_each_answers_latency_and_the_charts_count_it(app, client) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    svc = app.extensions["ledger"]
    for i in range(3):
        assert deliver(client, sender, f"evt_{i}").status_code == 202
    assert deliver(client, sender, "evt_0").status_code == 202  # a duplicate, still pending
    for i in range(2):
        assert deliver(client, sender, f"evt_x{i}", secret="whsec_bm90IG91cnM=").status_code == 401
    assert client.post("/hooks/in_0000000000000000000000", data=b"{}").status_code == 404
    svc.delivery_log.flush(everything=True)
    with svc.engine.connect() as conn:
        latencies = conn.execute(select(deliveries.c.latency_us)).scalars().all()
    assert len(latencies) == 7 and all(us is not None and us > 0 for us in latencies)
    refresh(svc.engine, FixedClock(svc.clock.now() + SETTLED))
    day = _health(logged_in(app, "viewer"), sender).split('<figure class="health">')[1]
    assert "2 refused" in day and "over 4 answered" in day and "p95 \u2264 " in day
