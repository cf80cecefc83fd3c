"""Real delivery shapes the senders send (CONTRACT section 2, third edition), over real HTTP
on both databases: GitHub form bodies and its 25 MB cap, Shopify's unprefixed headers and
webhook-id fallback, id-less Slack and Twilio deliveries, Twilio's default port, Standard
Webhooks carrying both header sets, and GitLab's token that signs nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import requests
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook as StandardWebhook
from twilio.request_validator import RequestValidator

from ledger.db.schema import conflicts, jobs, receipts
from tests.helpers import Sender, ledger_counts, make_sender, send_http
from tests.profile_keys import KEYS, URL

NOTHING = {"receipts": 0, "jobs": 0, "conflicts": 0}
FORM = "application/x-www-form-urlencoded"


def recorded(app: Any) -> list[tuple[str, str, Any, bytes]]:
    """Return (event id, type, job payload, body digest) of every receipt, oldest first."""
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(
            select(receipts.c.event_id, receipts.c.event_type, jobs.c.payload,
                   receipts.c.body_sha256)
            .join(jobs, (jobs.c.scope_id == receipts.c.scope_id)
                  & (jobs.c.event_id == receipts.c.event_id))
            .order_by(receipts.c.accepted_at)).all()
    return [(r.event_id, r.event_type, json.loads(r.payload), bytes(r.body_sha256))
            for r in rows]


def digest_id(body_sha256: bytes) -> str:
    """The id CONTRACT section 2 gives an id-less delivery."""
    return "sha256:" + body_sha256.hex()[:32]


# --- GitHub -----------------------------------------------------------------------------


def github_headers(body: bytes, event: str = "issues",
                   delivery: str = "72d3162e-cc78-11e3-81ab-4c9367dc0958") -> dict[str, str]:
    """The headers GitHub attaches, signed as its docs show."""
    key = KEYS["github"].stored.encode()
    return {"X-Hub-Signature-256": "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest(),
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
            "Content-Type": "application/json"}


def test_github_form_body_is_verified_raw_and_stored_decoded(app, live) -> None:
    """`payload=<url-encoded JSON>` (the API's default content_type) is accepted once."""
    sender = make_sender(app, name="gh", profile="github", secret=KEYS["github"].stored)
    event = {"action": "opened", "issue": {"number": 7, "title": "a & b = c"}}
    body = ("payload=" + quote(json.dumps(event), safe="")).encode()
    headers = {**github_headers(body), "Content-Type": FORM}
    first = send_http(live, sender, body, headers, content_type=None)
    assert first.status_code == 202, first.json()
    assert send_http(live, sender, body, headers, content_type=None).json()["status"] == "duplicate"
    [(event_id, event_type, payload, _)] = recorded(app)
    assert (event_id, event_type) == ("72d3162e-cc78-11e3-81ab-4c9367dc0958", "issues.opened")
    assert payload == {"payload": event}
    tampered = body.replace(b"opened", b"closed")
    assert send_http(live, sender, tampered, headers, content_type=None).status_code == 401
    assert ledger_counts(app)["receipts"] == 1


def _push_of(size: int) -> bytes:
    """A GitHub push body of about `size` bytes."""
    commits = [{"id": f"{i:040x}", "message": "x" * 900} for i in range(size // 1000)]
    return json.dumps({"ref": "refs/heads/main", "commits": commits}).encode()


def test_github_push_over_the_global_default_fits_githubs_own_cap(app, live) -> None:
    """A 1.46 MiB push is accepted (GitHub caps at 25 MB); other profiles keep 1 MiB."""
    body = _push_of(1_530_000)
    assert len(body) > 1024 * 1024
    github = make_sender(app, name="gh", profile="github", secret=KEYS["github"].stored)
    answer = send_http(live, github, body, github_headers(body, "push"), content_type=None)
    assert answer.status_code == 202, answer.text
    assert recorded(app)[0][1] == "push"
    stripe = make_sender(app, name="st", profile="stripe", secret=KEYS["stripe"].stored)
    stripe_body = json.dumps({"id": "evt_big", "type": "x.y", "pad": "x" * 1_530_000}).encode()
    now = int(time.time())
    signature = hmac.new(KEYS["stripe"].stored.encode(), f"{now}.".encode() + stripe_body,
                         hashlib.sha256).hexdigest()
    refused = send_http(live, stripe, stripe_body, {"Stripe-Signature": f"t={now},v1={signature}",
                                                    "Content-Type": "application/json"},
                        content_type=None)
    assert refused.status_code == 413
    assert ledger_counts(app)["receipts"] == 1


def test_github_limit_stays_overridable_per_integration(app, live) -> None:
    """An integration's own max-body-bytes wins over GitHub's default."""
    sender = make_sender(app, name="gh", profile="github", secret=KEYS["github"].stored,
                         max_body_bytes=2048)
    body = _push_of(10_000)
    refused = send_http(live, sender, body, github_headers(body, "push"), content_type=None)
    assert refused.status_code == 413
    assert ledger_counts(app) == NOTHING


# --- Shopify ----------------------------------------------------------------------------


def shopify_signature(body: bytes) -> str:
    """Shopify's base64 HMAC-SHA256 of the body under the app secret."""
    key = KEYS["shopify"].stored.encode()
    return base64.b64encode(hmac.new(key, body, hashlib.sha256).digest()).decode()


def test_shopify_unprefixed_header_set_is_accepted(app, live) -> None:
    """`shopify-hmac-sha256`, `shopify-topic`, `shopify-event-id`, `shopify-webhook-id`."""
    sender = make_sender(app, name="shop", profile="shopify", secret=KEYS["shopify"].stored)
    body = b'{"id": 820982911946154508, "email": "jon@example.com"}'
    headers = {"shopify-hmac-sha256": shopify_signature(body), "shopify-topic": "orders/create",
               "shopify-event-id": "98880550-7158-44d4-b7cd-2c97c8a091b5",
               "shopify-webhook-id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
               "Content-Type": "application/json"}
    answer = send_http(live, sender, body, headers, content_type=None)
    assert answer.status_code == 202, answer.json()
    assert recorded(app)[0][:2] == ("98880550-7158-44d4-b7cd-2c97c8a091b5", "orders.create")
    headers["shopify-hmac-sha256"] = shopify_signature(body + b" ")
    assert send_http(live, sender, body, headers, content_type=None).status_code == 401


def test_shopify_event_id_falls_back_to_the_webhook_id(app, live) -> None:
    """Without X-Shopify-Event-Id the webhook id is the event id, as Shopify's library has it."""
    sender = make_sender(app, name="shop", profile="shopify", secret=KEYS["shopify"].stored)
    body = b'{"id": 1}'
    headers = {"X-Shopify-Hmac-Sha256": shopify_signature(body),
               "X-Shopify-Topic": "products/update",
               "X-Shopify-Webhook-Id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
               "Content-Type": "application/json"}
    assert send_http(live, sender, body, headers, content_type=None).status_code == 202
    assert send_http(live, sender, body, headers, content_type=None).json()["status"] == "duplicate"
    assert recorded(app)[0][:2] == ("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043", "products.update")


# --- id-less deliveries -------------------------------------------------------------------


def test_slack_app_rate_limited_gets_the_body_digest_id(app, live) -> None:
    """Slack's `app_rate_limited` has no event_id: its id is made from the body."""
    sender = make_sender(app, name="sl", profile="slack", secret=KEYS["slack"].stored)
    body = json.dumps({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "type": "app_rate_limited",
                       "team_id": "T123456", "minute_rate_limited": 1518467820,
                       "api_app_id": "A123456"}).encode()
    now = str(int(time.time()))
    signature = hmac.new(KEYS["slack"].stored.encode(), f"v0:{now}:".encode() + body,
                         hashlib.sha256).hexdigest()
    headers = {"X-Slack-Signature": "v0=" + signature, "X-Slack-Request-Timestamp": now,
               "Content-Type": "application/json"}
    first = send_http(live, sender, body, headers, content_type=None)
    assert first.status_code == 202, first.json()
    assert send_http(live, sender, body, headers, content_type=None).json()["status"] == "duplicate"
    [(event_id, event_type, _, digest)] = recorded(app)
    assert event_id == digest_id(digest) == first.json()["event_id"]
    assert event_id == "sha256:" + hashlib.sha256(body).hexdigest()[:32]
    assert event_type == "app_rate_limited"


def twilio_sender(app: Any, url: str = URL) -> Sender:
    """A Twilio integration signed over `url`."""
    return make_sender(app, name="tw", profile="twilio", secret=KEYS["twilio"].stored,
                       endpoint_url=url)


def twilio_post(live: str, sender: Sender, params: dict[str, str], signed_url: str,
                **extra: str) -> requests.Response:
    """POST a form signed by twilio's RequestValidator over `signed_url`."""
    signature = RequestValidator(KEYS["twilio"].stored).compute_signature(signed_url, params)
    return send_http(live, sender, urlencode(params).encode(),
                {"X-Twilio-Signature": signature, "Content-Type": FORM, **extra}, content_type=None)


def test_twilio_without_idempotency_token_gets_the_body_digest_id(app, live) -> None:
    """A retry of the same id-less Twilio body is a duplicate, not a new event."""
    sender = twilio_sender(app)
    params = {"AccountSid": "AC0001", "CallSid": "CA0001", "From": "+15550001"}
    first = twilio_post(live, sender, params, URL)
    assert first.status_code == 202, first.json()
    assert twilio_post(live, sender, params, URL).json()["status"] == "duplicate"
    [(event_id, _, _, digest)] = recorded(app)
    assert event_id == digest_id(digest) == first.json()["event_id"]


@pytest.mark.parametrize(("configured", "signed"), [
    ("https://hooks.example.com/hooks/in_x", "https://hooks.example.com:443/hooks/in_x"),
    ("https://hooks.example.com:443/hooks/in_x", "https://hooks.example.com/hooks/in_x"),
    ("http://hooks.example.com/hooks/in_x?a=1", "http://hooks.example.com:80/hooks/in_x?a=1"),
])
def test_twilio_url_with_or_without_the_default_port(app, live, configured: str,
                                                     signed: str) -> None:
    """Twilio's libraries accept the URL with or without its scheme's default port."""
    sender = twilio_sender(app, configured)
    params = {"AccountSid": "AC0001", "CallSid": "CA0002"}
    assert twilio_post(live, sender, params, signed,
                       **{"I-Twilio-Idempotency-Token": "tok-1"}).status_code == 202
    other_port = signed.replace(":443", ":8443").replace(":80", ":8080")
    if other_port == signed:
        other_port = signed.replace("hooks.example.com", "hooks.example.com:8443")
    assert twilio_post(live, sender, params, other_port,
                       **{"I-Twilio-Idempotency-Token": "tok-2"}).status_code == 401
    assert ledger_counts(app)["receipts"] == 1


# --- Standard Webhooks: both header sets --------------------------------------------------


def both_sets(body: bytes, msg_id: str, *, svix_id: str | None = None,
              svix_timestamp: int | None = None) -> dict[str, str]:
    """Headers of a delivery carrying the webhook-* and the svix-* set, signed by the library."""
    now = datetime.now(UTC)
    signature = StandardWebhook(KEYS["standard-webhooks"].stored).sign(
        msg_id, now, body.decode())
    stamp = str(int(now.timestamp()))
    return {"webhook-id": msg_id, "webhook-timestamp": stamp, "webhook-signature": signature,
            "svix-id": svix_id or msg_id, "svix-timestamp": str(svix_timestamp or stamp),
            "svix-signature": signature, "Content-Type": "application/json"}


def test_standard_webhooks_with_both_header_sets(app, live) -> None:
    """Both sets naming the same id and timestamp: accepted once; disagreeing sets: 401."""
    sender = make_sender(app, name="sw", profile="standard-webhooks",
                         secret=KEYS["standard-webhooks"].stored)
    body = b'{"type": "user.created", "data": {}}'
    answer = send_http(live, sender, body, both_sets(body, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
                       content_type=None)
    assert answer.status_code == 202, answer.json()
    assert recorded(app)[0][:2] == ("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "user.created")
    other_id = both_sets(body, "msg_a", svix_id="msg_b")
    assert send_http(live, sender, body, other_id, content_type=None).status_code == 401
    other_time = both_sets(body, "msg_c", svix_timestamp=int(time.time()) - 1)
    assert send_http(live, sender, body, other_time, content_type=None).status_code == 401
    assert ledger_counts(app)["receipts"] == 1


# --- GitLab: a token that signs nothing ---------------------------------------------------


def test_gitlab_tampered_body_with_the_same_idempotency_key_is_a_conflict(app, live) -> None:
    """GitLab's token signs nothing: a changed body under a known key is a 409 conflict,
    recorded for operators, and the original receipt is untouched."""
    sender = make_sender(app, name="gl", profile="gitlab", secret=KEYS["gitlab"].stored)
    headers = {"X-Gitlab-Token": KEYS["gitlab"].stored, "X-Gitlab-Event": "Push Hook",
               "Idempotency-Key": "f5b1a6b1-9f4c-4c1b-9f4c-1b9f4c1b9f4c",
               "Content-Type": "application/json"}
    body = b'{"object_kind": "push", "ref": "refs/heads/main"}'
    assert send_http(live, sender, body, headers, content_type=None).status_code == 202
    tampered = send_http(live, sender, body.replace(b"main", b"evil"), headers, content_type=None)
    assert tampered.status_code == 409
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 1}
    assert recorded(app)[0][2]["ref"] == "refs/heads/main"
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(conflicts.c.event_id)).scalar_one() == headers[
            "Idempotency-Key"]
