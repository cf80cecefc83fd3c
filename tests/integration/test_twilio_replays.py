"""Twilio replays: what the signature cannot tell apart is one body (a duplicate), and a
JSON-mode signature never verifies a form (over real HTTP, both databases)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

import pytest
import requests
from flask import Flask
from twilio.request_validator import RequestValidator

from tests.helpers import Sender, ledger_counts, make_sender
from tests.profile_keys import KEYS
from tests.servers import thread_server

URL = "https://ledger.example/hooks/twilio"
BODY = "AccountSid=AC123&CallSid=CA42&From=%2B15551234567"
# The reported variants of one captured form, each signed by the captured signature.
EQUIVALENT = {
    "empty pair": BODY + "&=",
    "two empty pairs": BODY + "&=&=",
    "repeated pair": BODY + "&CallSid=CA42",
    "shifted boundary": BODY.replace("AccountSid=AC123", "AccountSi=dAC123"),
    "reordered": "From=%2B15551234567&CallSid=CA42&AccountSid=AC123",
}


@pytest.fixture
def twilio(app: Flask) -> Iterator[tuple[str, Sender]]:
    """A served app with a Twilio integration holding the auth token and endpoint URL."""
    sender = make_sender(app, name="twilio-app", profile="twilio",
                         secret=KEYS["twilio"].stored, endpoint_url=URL)
    with thread_server(app) as base:
        yield base, sender


def _post(base: str, sender: Sender, body: str, signature: str, token: str,
          media: str = "application/x-www-form-urlencoded") -> requests.Response:
    return requests.post(f"{base}/hooks/{sender.public_id}", data=body.encode(), timeout=30,
                         headers={"X-Twilio-Signature": signature, "Content-Type": media,
                                  "I-Twilio-Idempotency-Token": token})


def test_signature_equivalent_forms_are_duplicates_not_new_events(app: Flask,
                                                                   twilio: Any) -> None:
    """One captured delivery was accepted as four new events; now it is one."""
    base, sender = twilio
    validator = RequestValidator(KEYS["twilio"].stored)
    signature = validator.compute_signature(URL, dict(parse_qsl(BODY)))
    first = _post(base, sender, BODY, signature, "idem-1")
    assert first.status_code == 202, first.text
    for n, (name, variant) in enumerate(EQUIVALENT.items()):
        answer = _post(base, sender, variant, signature, f"idem-replay-{n}")
        assert answer.status_code in (200, 202), (name, answer.text)
        assert answer.json()["status"] == "duplicate", (name, answer.json())
        assert answer.json()["event_id"] == "idem-1", name
    assert ledger_counts(app)["receipts"] == 1 and ledger_counts(app)["jobs"] == 1


def test_a_json_mode_signature_never_verifies_a_forged_form(app: Flask, twilio: Any) -> None:
    """The captured JSON-mode signature covers URL?bodySHA256=<hex>; a form spelling it fails."""
    base, sender = twilio
    validator = RequestValidator(KEYS["twilio"].stored)
    body = '{"CallSid":"CA1234567890ABCDE"}'
    digest = validator.compute_hash(body)
    signature = validator.compute_signature(f"{URL}?bodySHA256={digest}", {})
    assert _post(base, sender, body, signature, "idem-json", "application/json"
                 ).status_code == 202
    before = ledger_counts(app)
    for forged in (f"%3FbodySHA256=%3D{digest}", f"%3FbodySHA256%3D={digest}",
                   f"%3Fbody=SHA256%3D{digest}"):
        answer = _post(base, sender, forged, signature, "idem-forged")
        assert answer.status_code == 401, (forged, answer.text)
    assert ledger_counts(app) == before


def test_a_form_of_many_empty_pairs_is_refused_before_it_is_parsed(app: Flask,
                                                                   twilio: Any) -> None:
    """A 1 MiB `a=&` x 349k body with a bad signature cost 2.25 s of CPU to refuse."""
    from sqlalchemy import select

    from ledger.db.schema import deliveries

    base, sender = twilio
    answer = _post(base, sender, "a=&" * 349_000, "AAAAAAAAAAAAAAAAAAAAAAAAAAA=", "idem-x")
    assert answer.status_code == 401
    svc = app.extensions["ledger"]
    svc.delivery_log.flush(everything=True)
    with svc.engine.connect() as conn:
        reasons = conn.execute(select(deliveries.c.reason)).scalars().all()
    assert reasons == ["malformed_body"]  # refused at the field count, not after a parse
    assert ledger_counts(app)["receipts"] == 0
