"""Finding a refusal: signed refusals keep event id and key, search falls back to the delivery
log, Deliveries filters by event id and scope prefix, oncall sees the refusal category."""

from __future__ import annotations

from sqlalchemy import select

from ledger.access import audit
from ledger.access.credentials import revoke_credential
from ledger.clock import unix
from ledger.db.schema import deliveries
from tests.dashboard_helpers import fast_hashes, logged_in
from tests.helpers import deliver, make_sender

__all__ = ["fast_hashes"]
ADMIN = audit.Actor(name="test", role="admin")


def _seed(app):  # type: ignore[no-untyped-def]
    """acme/stripe-prod: a stale delivery, a forged one, then its key revoked and used."""
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    other = make_sender(app, account="acme", name="shopify-eu")
    client = app.test_client()
    deliver(client, other, "evt_fine")
    stale = unix(svc.clock.now()) - 3600
    assert deliver(client, sender, "evt_stale", timestamp=stale).status_code == 401
    assert deliver(client, sender, "evt_forged", secret="whsec_not_ours").status_code == 401
    with svc.engine.begin() as conn:
        revoke_credential(conn, ADMIN, sender.key_id, reason="leaked", now=svc.clock.now())
    svc.view.invalidate()
    assert deliver(client, sender, "evt_after_revoke").status_code == 401
    svc.delivery_log.flush(everything=True)
    return sender, other


def test_signed_refusals_keep_event_id_and_key(app) -> None:  # type: ignore[no-untyped-def]
    sender, _ = _seed(app)
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(deliveries.c.reason, deliveries.c.key_id,
                                   deliveries.c.event_id)
                            .where(deliveries.c.outcome == "unauthenticated")
                            .order_by(deliveries.c.id)).all()
    assert [tuple(r) for r in rows] == [
        ("stale_timestamp", sender.key_id, "evt_stale"),
        ("bad_signature", None, None),  # not verified: the id is a claim, not kept
        ("revoked_key", sender.key_id, "evt_after_revoke"),
    ]


def test_search_falls_back_to_the_delivery_log(app) -> None:  # type: ignore[no-untyped-def]
    _seed(app)
    viewer = logged_in(app, "viewer")
    found = viewer.get("/search?q=evt_after_revoke")
    assert found.status_code == 303
    assert "event_id=evt_after_revoke" in found.headers["Location"]
    page = viewer.get(found.headers["Location"]).get_data(as_text=True)
    assert "evt_after_revoke" in page and "evt_stale" not in page
    assert viewer.get("/search?q=evt_forged").status_code == 404


def test_event_id_filter_and_scope_prefix(app) -> None:  # type: ignore[no-untyped-def]
    _sender, _other = _seed(app)
    oncall = logged_in(app, "oncall")
    page = oncall.get("/deliveries?event_id=evt_stale").get_data(as_text=True)
    assert "evt_stale" in page and "evt_fine" not in page
    for prefix in ("acme", "acme/shop", "ac"):
        page = oncall.get(f"/deliveries?integration={prefix}").get_data(as_text=True)
        assert "evt_fine" in page, prefix
        assert ("evt_stale" in page) == (prefix != "acme/shop"), prefix
    nothing = oncall.get("/deliveries?integration=initech")
    assert nothing.status_code == 400
    assert oncall.get("/deliveries?event_id=bad%20id").status_code == 400


def test_oncall_sees_the_refusal_category_not_the_reason(app) -> None:  # type: ignore[no-untyped-def]
    sender, _ = _seed(app)
    oncall = logged_in(app, "oncall")
    page = oncall.get(f"/deliveries?key_id={sender.key_id}").get_data(as_text=True)
    assert "revoked_key" in page and "stale_timestamp" in page
    assert "<th>Reason</th>" not in page
    viewer = logged_in(app, "viewer")
    assert "revoked_key" not in viewer.get("/deliveries").get_data(as_text=True)
