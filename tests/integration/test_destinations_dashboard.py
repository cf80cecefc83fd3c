"""/api/v1/destinations and the destinations page: health, hidden answers, pause/resume."""

from __future__ import annotations

import json

from sqlalchemy import select

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.db.schema import audit_log, destinations
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.store import DestinationSettings, create_destination, record_attempt
from tests.a11y import unlabelled_controls
from tests.dashboard_helpers import (
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
    make_operator,
    make_token,
    post,
)
from tests.helpers import make_sender

SECRET_ANSWER = '{"error":"card 4242 declined"}'


def _destination(app, *, answers: list[tuple[int | None, str, float]] = (),  # type: ignore[no-untyped-def,assignment]
                 name: str = "shop", event_types: tuple[str, ...] = ("order.paid",)):
    """Create a destination of order.paid with attempts (status, outcome, latency)."""
    svc = app.extensions["ledger"]
    sender = make_sender(app, account="acme", name=name)
    with svc.engine.begin() as conn:
        created = create_destination(
            conn, svc.box, audit.Actor(name="test", role="admin"),
            get_integration(conn, sender.public_id),
            DestinationSettings(url="https://orders.example.com/in",
                                event_types=list(event_types)),
            policy=AddressPolicy(), handled_types=(), now=svc.clock.now())
        for number, (status, outcome, latency) in enumerate(answers, 1):
            record_attempt(conn, created.destination.id, scope_id=sender.scope_id,
                           event_id=f"evt_{number}", number=1, started_at=svc.clock.now(),
                           latency_ms=latency, http_status=status, outcome=outcome,
                           error=None if outcome == "complete" else f"destination answered "
                                                                     f"{status}",
                           response_excerpt=SECRET_ANSWER if outcome != "complete" else "ok")
    return sender, created


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_api_shows_health_and_never_a_secret(app):
    answers = [(200, "complete", 10.0 * i) for i in range(1, 20)] + [(503, "retry", 500.0)]
    sender, created = _destination(app, answers=answers)
    add_receipt(app, sender.scope_id, "evt_wait_1", state=0, event_type="order.paid")
    add_receipt(app, sender.scope_id, "evt_wait_2", state=0, event_type="order.paid")
    add_receipt(app, sender.scope_id, "evt_other", state=0, event_type="order.shipped")
    make_operator(app, "olga", "oncall")
    response = app.test_client().get("/api/v1/destinations",
                                     headers=_bearer(make_token(app, "olga")))
    assert response.status_code == 200
    (item,) = response.get_json()["destinations"]
    assert item["destination"] == created.destination.public_id
    assert (item["state"], item["scope"], item["event_types"]) == ("active", "acme/shop",
                                                                   ["order.paid"])
    assert item["success_rate"] == 0.95 and item["attempts_sampled"] == 20
    assert item["p95_latency_ms"] == 190.0
    assert item["backlog"] == 2
    (failure,) = item["recent_failures"]
    assert (failure["http_status"], failure["response_excerpt"]) == (503, SECRET_ANSWER)
    text = response.get_data(as_text=True)
    assert created.signing_secret not in text and "secret" not in text


def test_each_destination_shows_its_own_health(app):
    """Many destinations are read together; none borrows another's figures."""
    fast = [(200, "complete", float(i)) for i in range(1, 41)]
    flaky = [(200, "complete", 100.0), (200, "complete", 300.0)] + [
        (500 + i, "retry", 50.0 * i) for i in range(1, 8)]
    shop, first = _destination(app, answers=fast, name="shop")
    bank, second = _destination(app, answers=flaky, name="bank", event_types=())
    _idle, third = _destination(app, name="idle")
    add_receipt(app, shop.scope_id, "evt_wait", state=0, event_type="order.paid")
    for i in range(3):
        add_receipt(app, bank.scope_id, f"evt_any_{i}", state=0, event_type=f"t.{i}")
    make_operator(app, "olga", "oncall")
    response = app.test_client().get("/api/v1/destinations",
                                     headers=_bearer(make_token(app, "olga")))
    items = {i["destination"]: i for i in response.get_json()["destinations"]}
    one, two, three = (items[d.destination.public_id] for d in (first, second, third))
    assert (one["attempts_sampled"], one["success_rate"], one["p95_latency_ms"],
            one["backlog"], one["recent_failures"]) == (40, 1.0, 38.0, 1, [])
    assert (two["attempts_sampled"], two["success_rate"], two["p95_latency_ms"],
            two["backlog"]) == (9, round(2 / 9, 4), 350.0, 3)
    assert [f["http_status"] for f in two["recent_failures"]] == [507, 506, 505, 504, 503]
    assert (three["attempts_sampled"], three["success_rate"], three["p95_latency_ms"],
            three["backlog"], three["recent_failures"]) == (0, None, None, 0, [])
    assert [i["scope"] for i in items.values()] == ["acme/shop", "acme/bank", "acme/idle"]


def test_a_viewer_never_sees_the_answers(app):
    _destination(app, answers=[(400, "failed", 12.0)])
    make_operator(app, "vera", "viewer")
    api = app.test_client().get("/api/v1/destinations", headers=_bearer(make_token(app, "vera")))
    (failure,) = api.get_json()["destinations"][0]["recent_failures"]
    assert failure["http_status"] == 400 and failure["response_excerpt"] is None
    page = logged_in(app, "viewer", "vic").get("/destinations").get_data(as_text=True)
    assert "card 4242" not in page and "400" in page and "hidden for your role" in page
    assert 'name="action"' not in page  # no pause/resume for a viewer
    oncall_page = logged_in(app, "oncall").get("/destinations").get_data(as_text=True)
    assert "card 4242" in oncall_page and 'value="pause"' in oncall_page
    assert unlabelled_controls(oncall_page) == [] and '<a class="skip"' in oncall_page


def test_an_unknown_integration_filter_is_404(app):
    make_operator(app, "vera", "viewer")
    headers = _bearer(make_token(app, "vera"))
    client = app.test_client()
    assert client.get("/api/v1/destinations?integration=in_nope",
                      headers=headers).status_code == 404
    assert client.get("/api/v1/destinations", headers=headers).get_json() == {
        "destinations": []}


def test_pause_and_resume_from_the_page_need_oncall_a_reason_and_are_audited(app):
    _sender, created = _destination(app)
    path = f"/destinations/{created.destination.public_id}/state"
    viewer = logged_in(app, "viewer")
    assert post(viewer, path, {"action": "pause", "reason": "x"}).status_code == 403
    oncall = logged_in(app, "oncall", "olga")
    no_csrf = oncall.post(path, data={"action": "pause", "reason": "x"})
    assert no_csrf.status_code == 400
    assert post(oncall, path, {"action": "pause", "reason": " "}, htmx=True).status_code == 409
    assert post(oncall, path, {"action": "explode", "reason": "x"}).status_code == 400
    paused = post(oncall, path, {"action": "pause", "reason": "vendor outage"}, htmx=True)
    assert paused.status_code == 200 and "paused" in paused.get_data(as_text=True)
    assert post(oncall, path, {"action": "pause", "reason": "again"}).status_code == 409
    resumed = post(oncall, path, {"action": "resume", "reason": "vendor back"}, htmx=True)
    assert resumed.status_code == 200
    missing = post(oncall, "/destinations/dst_nope/state", {"action": "pause", "reason": "x"})
    assert missing.status_code == 404
    svc = app.extensions["ledger"]
    with svc.engine.connect() as conn:
        rows = conn.execute(select(audit_log).where(audit_log.c.action.like("destination.%"))
                            .order_by(audit_log.c.id)).all()
        state = conn.execute(select(destinations.c.state)).scalar_one()
    assert [(r.action, r.actor, r.reason) for r in rows[1:]] == [
        ("destination.pause", "olga", "vendor outage"),
        ("destination.resume", "olga", "vendor back")]
    assert json.loads(rows[1].detail)["previous_state"] == "active"
    assert state == "active"


def test_a_receipt_shows_what_the_destination_answered(app):
    sender, _created = _destination(app, answers=[(502, "retry", 40.0)])
    add_receipt(app, sender.scope_id, "evt_1", state=0, event_type="order.paid")
    make_operator(app, "vera", "viewer")
    make_operator(app, "olga", "oncall")
    client = app.test_client()
    path = f"/api/v1/receipts/{sender.public_id}/evt_1"
    seen = client.get(path, headers=_bearer(make_token(app, "olga"))).get_json()
    (answer,) = seen["destination_attempts"]
    assert (answer["attempt"], answer["http_status"], answer["outcome"]) == (1, 502, "retry")
    assert answer["response_excerpt"] == SECRET_ANSWER
    hidden = client.get(path, headers=_bearer(make_token(app, "vera"))).get_json()
    assert hidden["destination_attempts"][0]["response_excerpt"] is None
    page = logged_in(app, "viewer", "vic").get(f"/receipts/{sender.public_id}/evt_1")
    html = page.get_data(as_text=True)
    assert "502" in html and "card 4242" not in html
    oncall_html = logged_in(app, "oncall", "otto").get(
        f"/receipts/{sender.public_id}/evt_1").get_data(as_text=True)
    assert "card 4242" in oncall_html
