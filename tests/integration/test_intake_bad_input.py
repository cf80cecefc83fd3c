"""Bad input: each case gets the right status and a JSON error, and writes nothing."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import Sender, event_body, ledger_counts, make_sender, signed_headers

NOW = int(time.time())
TOL = 300


def std_headers(sender: Sender, body: bytes, *, event_id: str = "msg_1",
                timestamp: str | None = None, signature: str | None = None) -> list:
    """Standard Webhooks headers, optionally with a hand-made part."""
    ts = timestamp if timestamp is not None else str(NOW)
    good = signed_headers(sender, body, event_id, "demo.credit",
                          timestamp=int(ts) if ts.isdigit() and len(ts) < 16 else NOW)
    return [("webhook-id", event_id), ("webhook-timestamp", ts),
            ("webhook-signature", good["webhook-signature"] if signature is None else signature),
            ("Content-Type", "application/json")]


def _std_body() -> bytes:
    return event_body("standard-webhooks", "msg_1")


def _stripe(sender: Sender, body: bytes, header: str) -> list:
    return [("Stripe-Signature", header), ("Content-Type", "application/json")]


def _stripe_signed(sender: Sender, body: bytes, *, timestamp: int | None = None) -> list:
    h = signed_headers(sender, body, "x", timestamp=timestamp)
    return [("Stripe-Signature", h["Stripe-Signature"]), ("Content-Type", "application/json")]


def _gh(sender: Sender, body: bytes, *, delivery: Any = "d-1", event: Any = "push",
        signature: str | None = None) -> list:
    good = signed_headers(sender, body, "d-1", "push")["X-Hub-Signature-256"]
    headers = [("X-Hub-Signature-256", good if signature is None else signature)]
    for name, value in (("X-GitHub-Delivery", delivery), ("X-GitHub-Event", event)):
        if isinstance(value, list):
            headers += [(name, v) for v in value]
        elif value is not None:
            headers.append((name, value))
    return headers


def _stripe_body(event_id: Any = "evt_1", event_type: Any = "demo.credit") -> bytes:
    return json.dumps({"id": event_id, "type": event_type, "data": {}}).encode()


def _now() -> int:
    return int(time.time())


def _with_timestamp(ts: str) -> Callable[[Sender], tuple[bytes, list]]:
    return lambda s: (_std_body(), std_headers(s, _std_body(), timestamp=ts))


Case = tuple[str, str, Callable[[Sender], tuple[bytes, list]], int]
CASES: list[Case] = [
    # --- signatures (401) ---
    ("std missing signature", "standard-webhooks",
     lambda s: (_std_body(), [h for h in std_headers(s, _std_body())
                              if h[0] != "webhook-signature"]), 401),
    ("std empty signature", "standard-webhooks",
     lambda s: (_std_body(), std_headers(s, _std_body(), signature="")), 401),
    ("std duplicated signature header", "standard-webhooks",
     lambda s: (_std_body(), [*std_headers(s, _std_body()), ("webhook-signature", "v1,AAAA")]),
     401),
    ("std token v1 alone", "standard-webhooks",
     lambda s: (_std_body(), std_headers(s, _std_body(), signature="v1")), 401),
    ("std token v1,a,b", "standard-webhooks",
     lambda s: (_std_body(), std_headers(s, _std_body(), signature="v1,a,b")), 401),
    ("std bad base64", "standard-webhooks",
     lambda s: (_std_body(), std_headers(s, _std_body(), signature="v1,@@@notbase64@@@")), 401),
    ("std only unknown schemes", "standard-webhooks",
     lambda s: (_std_body(), std_headers(
         s, _std_body(), signature="v2," + base64.b64encode(b"x" * 32).decode())), 401),
    ("std missing id", "standard-webhooks",
     lambda s: (_std_body(), [h for h in std_headers(s, _std_body()) if h[0] != "webhook-id"]),
     401),
    ("std duplicated id header", "standard-webhooks",
     lambda s: (_std_body(), [*std_headers(s, _std_body()), ("webhook-id", "msg_2")]), 401),
    ("stripe uppercase hex", "stripe",
     lambda s: (_stripe_body(), _stripe(s, _stripe_body(), _stripe_signed(
         s, _stripe_body())[0][1].upper().replace("T=", "t=").replace("V1=", "v1="))), 401),
    ("stripe non-ascii", "stripe",
     lambda s: (_stripe_body(), _stripe(s, _stripe_body(), f"t={NOW},v1=é")), 401),
    ("stripe only v0 scheme", "stripe",
     lambda s: (_stripe_body(), _stripe(s, _stripe_body(), f"t={NOW},v0={'a' * 64}")), 401),
    ("stripe missing header", "stripe", lambda s: (_stripe_body(), []), 401),
    ("github sha1 only", "github",
     lambda s: (b'{"a":1}', _gh(s, b'{"a":1}', signature="sha1=" + "a" * 40)), 401),
    ("github missing signature", "github",
     lambda s: (b'{"a":1}', [h for h in _gh(s, b'{"a":1}') if h[0] != "X-Hub-Signature-256"]),
     401),
    # --- timestamps (401) ---
    *[(f"std timestamp {label}", "standard-webhooks",
       _with_timestamp(ts), 401)
      for label, ts in (("hello", "hello"), ("empty", ""), ("1e10", "1e10"), ("NaN", "NaN"),
                        ("negative", "-5"), ("fractional", f"{NOW}.5"),
                        ("milliseconds", str(NOW * 1000)))],
    ("stripe stale by tolerance+1", "stripe",
     lambda s: (_stripe_body(), _stripe_signed(s, _stripe_body(), timestamp=_now() - TOL - 1)),
     401),
    ("stripe future by tolerance+1", "stripe",
     lambda s: (_stripe_body(), _stripe_signed(s, _stripe_body(), timestamp=_now() + TOL + 2)),
     401),
    # --- event ids and types (400) ---
    ("id empty", "stripe", lambda s: (_stripe_body(""), _stripe_signed(s, _stripe_body(""))), 400),
    ("id 10 KB", "stripe",
     lambda s: (_stripe_body("e" * 10240), _stripe_signed(s, _stripe_body("e" * 10240))), 400),
    ("id with NUL", "stripe",
     lambda s: (_stripe_body("evt\x00"), _stripe_signed(s, _stripe_body("evt\x00"))), 400),
    ("id unicode", "stripe",
     lambda s: (_stripe_body("évt_1"), _stripe_signed(s, _stripe_body("évt_1"))), 400),
    ("id with spaces", "stripe",
     lambda s: (_stripe_body("evt 1"), _stripe_signed(s, _stripe_body("evt 1"))), 400),
    ("id not a string", "stripe",
     lambda s: (_stripe_body(42), _stripe_signed(s, _stripe_body(42))), 400),
    ("id missing", "stripe",
     lambda s: (b'{"type":"a"}', _stripe_signed(s, b'{"type":"a"}')), 400),
    ("id trailing newline", "stripe",
     lambda s: (_stripe_body("evt_1\n"), _stripe_signed(s, _stripe_body("evt_1\n"))), 400),
    ("type missing", "stripe",
     lambda s: (b'{"id":"evt_1"}', _stripe_signed(s, b'{"id":"evt_1"}')), 400),
    ("type bad", "stripe",
     lambda s: (_stripe_body(event_type="<script>"),
                _stripe_signed(s, _stripe_body(event_type="<script>"))), 400),
    ("github duplicated delivery header", "github",
     lambda s: (b'{"a":1}', _gh(s, b'{"a":1}', delivery=["d-1", "d-2"])), 400),
    ("github missing delivery header", "github",
     lambda s: (b'{"a":1}', _gh(s, b'{"a":1}', delivery=None)), 400),
    # --- bodies (400) ---
    *[(f"body {label}", "stripe",
       (lambda b: lambda s: (b, _stripe_signed(s, b)))(body), 400)
      for label, body in (("empty", b""), ("not json", b"hello"), ("array", b"[1,2]"),
                          ("null", b"null"), ("invalid utf-8", b'{"id":"\xff\xfe"}'),
                          ("NaN constant", b'{"id":"e","type":"t","x":NaN}'),
                          ("10k-deep nesting", b"[" * 10000 + b"]" * 10000),
                          ("utf-16", '{"id":"e","type":"t"}'.encode("utf-16")))],
]


@pytest.mark.parametrize(("label", "profile", "build", "status"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_delivery_is_refused_and_writes_nothing(app, client, label, profile, build, status):
    sender = make_sender(app, name="bad-input", profile=profile, tolerance=TOL)
    body, headers = build(sender)
    response = client.post(f"/hooks/{sender.public_id}", data=body, headers=headers)
    assert response.status_code == status, response.get_json()
    expected_error = "unauthenticated" if status == 401 else "invalid_event"
    assert response.get_json()["error"] == expected_error
    if status == 400:
        assert response.get_json()["detail"]
    assert ledger_counts(app) == {"receipts": 0, "jobs": 0, "conflicts": 0}


def test_timestamp_exactly_at_tolerance_is_still_fresh(app, client):
    sender = make_sender(app, tolerance=TOL)
    body = _stripe_body()
    response = client.post(f"/hooks/{sender.public_id}", data=body,
                           headers=_stripe_signed(sender, body,
                                                  timestamp=int(time.time()) - TOL + 2))
    assert response.status_code == 202


def test_unknown_integration_is_404(app, client):
    for public_id in ("in_AAAAAAAAAAAAAAAAAAAAAA", "nope", "in_" + "x" * 500):
        response = client.post(f"/hooks/{public_id}", data=b"{}")
        assert response.status_code == 404
        assert response.get_json() == {"error": "unknown_integration"}


def test_wrong_method_is_405_json(app, client):
    sender = make_sender(app)
    response = client.get(f"/hooks/{sender.public_id}")
    assert response.status_code == 405
    assert response.get_json() == {"error": "method_not_allowed"}
    assert "POST" in response.headers["Allow"]


def test_body_over_the_limit_is_413(app, client):
    sender = make_sender(app, max_body_bytes=100)
    body = json.dumps({"id": "evt_1", "type": "t", "pad": "x" * 200}).encode()
    response = client.post(f"/hooks/{sender.public_id}", data=body,
                           headers=_stripe_signed(sender, body))
    assert response.status_code == 413
    assert response.get_json() == {"error": "body_too_large"}
    assert ledger_counts(app)["receipts"] == 0


def test_body_at_the_limit_is_read(app, client):
    body = _stripe_body()
    sender = make_sender(app, max_body_bytes=len(body))
    response = client.post(f"/hooks/{sender.public_id}", data=body,
                           headers=_stripe_signed(sender, body))
    assert response.status_code == 202
