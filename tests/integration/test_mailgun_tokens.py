"""Mailgun's signature covers its timestamp and token only, not the event: over real HTTP on
both databases, a captured signature object carrying a forged event is refused (401,
nothing written), a genuine retry is a duplicate, and the kept token is forgotten by the
retention sweep once its timestamp has left the freshness window."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from jobs.retention import purge
from ledger.clock import FixedClock
from ledger.db.schema import receipts, sender_tokens
from tests.helpers import Sender, ledger_counts, make_sender, send_http
from tests.profile_keys import KEYS

TOLERANCE = 300


def connect(app: Any) -> Sender:
    """Connect a Mailgun integration with its test signing key."""
    return make_sender(app, name="in-mailgun", profile="mailgun",
                       secret=KEYS["mailgun"].stored, tolerance=TOLERANCE)


def signature(token: str, moment: int) -> dict[str, str]:
    """A signature object as Mailgun writes it: hex HMAC-SHA256 of `{timestamp}{token}`."""
    mac = hmac.new(KEYS["mailgun"].stored.encode(), f"{moment}{token}".encode(),
                   hashlib.sha256).hexdigest()
    return {"timestamp": str(moment), "token": token, "signature": mac}


def delivery(signed: dict[str, str], event_id: str, recipient: str = "alice@example.com",
             event: str = "delivered") -> bytes:
    """A Mailgun webhook body: the signature object beside the (unsigned) event."""
    return json.dumps({"signature": signed, "event-data": {
        "id": event_id, "event": event, "recipient": recipient}}).encode()


def token(n: int) -> str:
    """A 50-character token like Mailgun's."""
    return hashlib.sha256(f"token-{n}".encode()).hexdigest()[:50]


def receipt_ids(app: Any) -> list[str]:
    """Every receipt's event id."""
    with app.extensions["ledger"].engine.connect() as conn:
        return list(conn.execute(select(receipts.c.event_id).order_by(receipts.c.event_id))
                    .scalars())


def kept_tokens(app: Any) -> int:
    """How many signature tokens the ledger keeps."""
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(sender_tokens)).scalar_one())


def test_a_captured_signature_carrying_a_forged_event_is_refused(app, live) -> None:
    """A new event id, or a changed event under the same id, with a used token: 401."""
    sender = connect(app)
    captured = signature(token(1), int(time.time()))
    assert send_http(live, sender, delivery(captured, "evt-real"), {}).status_code == 202
    forged = send_http(live, sender, delivery(captured, "evt-forged", "mallory@example.com"),
                       {})
    assert forged.status_code == 401
    assert forged.json() == {"error": "unauthenticated"}
    same_id = send_http(live, sender, delivery(captured, "evt-real", "mallory@example.com"), {})
    assert same_id.status_code == 401
    assert receipt_ids(app) == ["evt-real"]
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 0}


def test_a_genuine_retry_is_a_duplicate_with_the_recorded_outcome(app, live) -> None:
    """The same delivery again answers as a duplicate in the recorded state; a body under a
    known id with another token (the digest covers the whole body) is a 409, as before."""
    sender = connect(app)
    body = delivery(signature(token(2), int(time.time())), "evt-retry")
    assert send_http(live, sender, body, {}).status_code == 202
    again = send_http(live, sender, body, {})
    assert again.status_code == 202
    assert again.json() == {"status": "duplicate", "event_id": "evt-retry", "state": "pending"}
    changed = delivery(signature(token(4), int(time.time())), "evt-retry", "bob@example.com")
    assert send_http(live, sender, changed, {}).status_code == 409
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 1}


def test_a_refused_delivery_keeps_no_token(app, live) -> None:
    """A token first seen on a refused body (an invalid event) is not spent by it."""
    sender = connect(app)
    signed = signature(token(5), int(time.time()))
    assert send_http(live, sender, delivery(signed, "bad id with spaces"), {}).status_code == 400
    assert kept_tokens(app) == 0
    assert send_http(live, sender, delivery(signed, "evt-ok"), {}).status_code == 202
    assert receipt_ids(app) == ["evt-ok"]


def test_the_token_is_forgotten_once_it_left_the_window(app, live) -> None:
    """The retention sweep keeps the token while its timestamp is fresh, then drops it."""
    sender = connect(app)
    moment = int(time.time())
    assert send_http(live, sender, delivery(signature(token(6), moment), "evt-old"),
                     {}).status_code == 202
    svc = app.extensions["ledger"]
    signed_at = datetime.fromtimestamp(moment, UTC)
    purge(svc.engine, svc.settings, FixedClock(signed_at + timedelta(seconds=TOLERANCE - 1)))
    assert kept_tokens(app) == 1
    purge(svc.engine, svc.settings, FixedClock(signed_at + timedelta(seconds=TOLERANCE + 1)))
    assert kept_tokens(app) == 0
    assert receipt_ids(app) == ["evt-old"]  # the receipt stays for its retention


def test_the_first_event_to_use_a_token_keeps_it(app, live) -> None:
    """What remains (docs/senders/mailgun.md): a forged event that arrives first with a
    captured token is accepted and the genuine one with that token is refused; the genuine
    event signed with another token is accepted."""
    sender = connect(app)
    captured = signature(token(7), int(time.time()))
    assert send_http(live, sender, delivery(captured, "evt-forged-first"), {}).status_code == 202
    assert send_http(live, sender, delivery(captured, "evt-genuine"), {}).status_code == 401
    fresh = signature(token(8), int(time.time()))
    assert send_http(live, sender, delivery(fresh, "evt-genuine"), {}).status_code == 202
    assert receipt_ids(app) == ["evt-forged-first", "evt-genuine"]
