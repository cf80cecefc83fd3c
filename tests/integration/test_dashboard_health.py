"""Per-integration delivery health: success rate and volume over 24 h and 7 days as SVG."""

from __future__ import annotations

from datetime import timedelta

from jobs.rollups import refresh
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
)
from tests.helpers import make_sender


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
    html = client.get(f"/credentials/{sender.public_id}/health",
                      headers={"HX-Request": "true"}).get_data(as_text=True)
    assert html.count("<svg") == 2
    assert "80.0 % succeeded" in html and "(10 accepted, 2 failed)" in html  # 24 h
    assert "90.0 % succeeded" in html and "(20 accepted, 2 failed)" in html  # 7 days
    assert "not recorded yet" in html  # refusals and latency are not guessed
    empty = client.get(f"/credentials/{other.public_id}/health").get_data(as_text=True)
    assert "0.0 % succeeded" in empty
    assert client.get("/credentials/in_nope/health").status_code == 404
    page = client.get(f"/credentials/{sender.public_id}").get_data(as_text=True)
    assert f"/credentials/{sender.public_id}/health" in page
