"""Revocation evidence: refreshed on N of N web instances (slowest X s), deliveries since the
revocation split into accepted within the bound (each linked) and refused; `ledger dev --demo`
keeps its web instance registered."""

from __future__ import annotations

from datetime import timedelta

from flask import Flask
from sqlalchemy import insert

from jobs.credential_jobs import check_revocation_propagation
from ledger.access import audit
from ledger.access.credentials import revoke_credential
from ledger.db.schema import deliveries
from tests.dashboard_helpers import add_receipt, fast_hashes, logged_in
from tests.helpers import Sender, make_sender
from tests.integration.test_ops_dashboard import _instance

__all__ = ["fast_hashes"]


def seed_revocation(app: Flask) -> Sender:
    """A key revoked 20 s ago; two web instances refreshed 2 s and 15 s after it; one
    delivery accepted 3 s after the revocation, two refused after the bound."""
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    sender = make_sender(app)
    revoked_at = now - timedelta(seconds=20)
    with svc.engine.begin() as conn:
        revoke_credential(conn, audit.Actor(name="sam", role="security"), sender.key_id,
                          reason="leaked", now=revoked_at)
    _instance(app, "web-a:1:x", "web", age=1, refreshed_age=5)
    _instance(app, "web-b:2:x", "web", age=1, refreshed_age=18)
    add_receipt(app, sender.scope_id, "evt_late", accepted_at=revoked_at + timedelta(seconds=3))
    rows = [("accepted", 202, 3, "evt_late"), ("unauthenticated", 401, 12, "evt_x"),
            ("unauthenticated", 401, 14, "evt_y")]
    with svc.engine.begin() as conn:
        conn.execute(insert(deliveries), [
            {"at": revoked_at + timedelta(seconds=after), "integration_id": sender.scope_id,
             "public_id": sender.public_id, "outcome": outcome, "http_status": status,
             "key_id": sender.key_id, "event_id": event_id, "client": "203.0.113.9",
             "reason": None if status == 202 else "revoked_key", "count": 1}
            for outcome, status, after, event_id in rows])
    check_revocation_propagation(svc.engine, svc.settings, svc.clock)
    return sender


def test_credentials_page_shows_propagation_and_use_since(app: Flask) -> None:
    sender = seed_revocation(app)
    page = logged_in(app, "viewer").get(f"/credentials/{sender.public_id}").get_data(
        as_text=True)
    section = page.split('id="revocations"')[1]
    assert "2 of 2</strong> web instances" in section and "slowest at most 15s" in section
    assert "1 accepted" in section and "2 refused" in section
    assert f"/receipts/{sender.public_id}/evt_late" in section
    assert "evt_x" not in section  # refused ones are counted, not listed


def test_an_instance_not_yet_refreshed_is_named(app: Flask) -> None:
    sender = seed_revocation(app)
    _instance(app, "web-c:3:x", "web", age=1, refreshed_age=60)  # before the revocation
    page = logged_in(app, "viewer").get(f"/credentials/{sender.public_id}").get_data(
        as_text=True)
    assert "2 of 3</strong>" in page and "web-c:3:x" in page


def test_ledger_dev_demo_keeps_its_web_instance(app: Flask) -> None:
    from ledger.cli.demo_cmds import seed_demo

    svc = app.extensions["ledger"]
    with app.app_context():
        seed_demo(serving=True)
    assert svc.heartbeat is not None and not svc.heartbeat._disabled
