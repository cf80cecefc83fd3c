"""Senders without a Python library: their documented scheme, computed here from the docs.

Each vector is built with the standard library exactly as the sender's
documentation describes it (header, signed content, key, encoding), independently
of the ledger's schemes, and then verified by the profile.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import PROFILES
from tests.profile_keys import KEYS

NOW = 1_700_000_000
TOL = 300


def mac(name: str, message: bytes) -> bytes:
    """Return HMAC-SHA256 of `message` under the sender's shared secret."""
    return hmac.new(KEYS[name].stored.encode(), message, hashlib.sha256).digest()


def check(name: str, headers: dict[str, str], body: bytes, *, now: int = NOW) -> int:
    """Verify under the preset with lower-cased header names, as the intake passes them."""
    received = {key.lower(): [value] for key, value in headers.items()}
    return PROFILES[name].verify(received, body, [KEYS[name].stored], now=now,
                                 tolerance=TOL).secret_index


def refused(name: str, headers: dict[str, str], body: bytes, *, now: int = NOW) -> str:
    """Return the refusal reason."""
    with pytest.raises(AuthenticationFailed) as caught:
        check(name, headers, body, now=now)
    return caught.value.reason


def test_shopify_base64_hmac_of_the_body() -> None:
    """Shopify: X-Shopify-Hmac-Sha256 = base64(HMAC-SHA256(secret, raw body))."""
    body = b'{"id": 820982911946154508, "email": "jon@example.com"}'
    signature = base64.b64encode(mac("shopify", body)).decode()
    assert check("shopify", {"X-Shopify-Hmac-Sha256": signature}, body) == 0
    headers = {"x-shopify-topic": ["orders/create"], "x-shopify-event-id": ["98880550-7158"]}
    identity = PROFILES["shopify"].identity(headers, json.loads(body), body)
    assert (identity.event_id, identity.event_type) == ("98880550-7158", "orders.create")
    assert refused("shopify", {"X-Shopify-Hmac-Sha256": signature}, body + b"\n") == \
        "bad_signature"


def test_linear_hex_hmac_and_body_timestamp() -> None:
    """Linear: Linear-Signature = hex HMAC-SHA256 of the body; webhookTimestamp within range."""
    payload = {"action": "create", "type": "Issue", "webhookTimestamp": NOW * 1000,
               "data": {"id": "i-1"}}
    body = json.dumps(payload).encode()
    assert check("linear", {"Linear-Signature": mac("linear", body).hex()}, body) == 0
    assert refused("linear", {"Linear-Signature": mac("linear", body).hex()}, body,
                   now=NOW + 3600) == "stale_timestamp"
    identity = PROFILES["linear"].identity({"linear-delivery": ["d-1"]}, payload, body)
    assert (identity.event_id, identity.event_type) == ("d-1", "Issue.create")


def test_pagerduty_several_v1_signatures() -> None:
    """PagerDuty v3: `v1=<hex>[,v1=<hex>]` over the body; any one valid entry verifies."""
    body = b'{"event": {"id": "01DEN4HPBQAJ8E", "event_type": "incident.triggered"}}'
    good = mac("pagerduty", body).hex()
    wrong = hashlib.sha256(b"x").hexdigest()
    for header in (f"v1={good}", f"v1={wrong},v1={good}", f"v1={good},v2=future",
                   f"v1=not-hex,v1={good}"):
        assert check("pagerduty", {"X-PagerDuty-Signature": header}, body) == 0, header
    assert refused("pagerduty", {"X-PagerDuty-Signature": f"v2={good}"}, body) == \
        "no_supported_signature"
    identity = PROFILES["pagerduty"].identity({}, json.loads(body), body)
    assert (identity.event_id, identity.event_type) == ("01DEN4HPBQAJ8E", "incident.triggered")


def test_zoom_v0_signature_and_body_derived_id() -> None:
    """Zoom: x-zm-signature = v0=hex(HMAC-SHA256(token, "v0:{ts}:{body}"))."""
    body = b'{"event": "meeting.started", "payload": {"object": {"id": 1}}, "event_ts": 1}'
    signature = "v0=" + mac("zoom", f"v0:{NOW}:".encode() + body).hex()
    headers = {"x-zm-signature": signature, "x-zm-request-timestamp": str(NOW)}
    assert check("zoom", headers, body) == 0
    first = PROFILES["zoom"].identity({}, json.loads(body), body).event_id
    assert first == PROFILES["zoom"].identity({}, {}, body).event_id  # a retry is a duplicate
    assert first != PROFILES["zoom"].identity({}, {}, body + b" ").event_id


def test_paddle_documented_header_shape() -> None:
    """Paddle: `ts=<unix>;h1=<hex HMAC-SHA256 of "{ts}:{body}">`."""
    body = b'{"event_id": "evt_01h", "event_type": "transaction.completed"}'
    header = f"ts={NOW};h1=" + mac("paddle", f"{NOW}:".encode() + body).hex()
    assert check("paddle", {"Paddle-Signature": header}, body) == 0
    assert refused("paddle", {"Paddle-Signature": header}, body, now=NOW - TOL - 1) == \
        "future_timestamp"
    assert refused("paddle", {"Paddle-Signature": header.replace(";", ",")}, body) == \
        "malformed_timestamp"  # one entry: ts="<unix>,h1=…"


def test_gitlab_token_is_compared_whole() -> None:
    """GitLab: X-Gitlab-Token carries the secret token itself; a prefix of it is refused."""
    body = b'{"object_kind": "push"}'
    token = KEYS["gitlab"].stored
    assert check("gitlab", {"X-Gitlab-Token": token}, body) == 0
    assert refused("gitlab", {"X-Gitlab-Token": token[:-1]}, body) == "bad_signature"
    assert refused("gitlab", {}, body) == "missing_signature"
    identity = PROFILES["gitlab"].identity({"idempotency-key": ["k-1"]}, json.loads(body), body)
    assert (identity.event_id, identity.event_type) == ("k-1", "push")


@pytest.mark.parametrize("name", ["discord", "sendgrid"])
def test_public_key_senders_get_no_generated_key(name: str) -> None:
    """A public key is issued by the sender: the ledger cannot make one up."""
    with pytest.raises(ValueError, match="public key"):
        PROFILES[name].generate_secret()
    assert PROFILES[name].secret.check(KEYS[name].stored) is None
    assert PROFILES[name].secret.is_public(KEYS[name].stored)
