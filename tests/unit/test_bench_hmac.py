"""The thin intake and the floor check Standard Webhooks signatures like the ledger."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from bench.thin_intake import KEY, verified_event_id

BODY = json.dumps({"type": "invoice.paid", "data": {}}).encode()


def _headers(event_id: str, body: bytes, key: bytes = KEY) -> dict[str, str]:
    signed = f"{event_id}.1700000000.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": event_id, "webhook-timestamp": "1700000000",
            "webhook-signature": f"v1,{signature}"}


def test_the_check_accepts_the_secret_and_refuses_anything_else() -> None:
    assert verified_event_id(BODY, _headers("evt_1", BODY)) == "evt_1"
    assert verified_event_id(BODY + b" ", _headers("evt_1", BODY)) is None
    assert verified_event_id(BODY, _headers("evt_1", BODY, key=b"other")) is None

