"""Every sender profile over HTTP on both databases: accept, dedup, refuse with nothing written,
handshakes, batches and form bodies as CONTRACT section 2 says."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from sqlalchemy import select

from ledger.db.schema import conflicts, jobs, receipts
from ledger.intake.signatures import PROFILES
from tests.helpers import (
    Sender,
    deliver,
    event_body,
    ledger_counts,
    make_sender,
    signed_headers,
)
from tests.profile_keys import KEYS, OTHER_KEYS, URL

NOTHING = {"receipts": 0, "jobs": 0, "conflicts": 0}
HMAC_OPTIONS = {"signature_header": "X-Acme-Signature", "algorithm": "sha512",
                "encoding": "base64", "prefix": "sha512=",
                "content": "{id}.{timestamp}.{body}", "timestamp_header": "X-Acme-Timestamp",
                "id_header": "X-Acme-Event", "type_header": "X-Acme-Type"}


def sender_for(app: Any, name: str, **settings: Any) -> Sender:
    """Connect preset `name` with its test key (and the endpoint URL it signs, if any)."""
    if getattr(PROFILES[name].scheme, "needs_url", False):
        settings.setdefault("endpoint_url", URL)
    return make_sender(app, name=f"in-{name}", profile=name, secret=KEYS[name].stored,
                       signing_key=KEYS[name].signing, **settings)


def hmac_sender(app: Any) -> Sender:
    """Connect a sender without a preset through the configurable hmac profile."""
    return make_sender(app, name="in-acme", profile="hmac", secret="acme-shared-secret",
                       hmac_options=HMAC_OPTIONS)


def post(client: Any, sender: Sender, body: bytes, headers: dict[str, str]) -> Any:
    """POST a delivery as given."""
    return client.post(f"/hooks/{sender.public_id}", data=body, headers=headers)


# Mailgun signs inside the body: tests/integration/test_intake_more_presets.py has its cases.
ALL = sorted(name for name, profile in PROFILES.items() if not profile.signature_in_body)


@pytest.mark.parametrize("name", ALL)
def test_each_profile_accepts_its_senders_delivery_once(app, client, name: str) -> None:
    """A delivery signed the sender's way is accepted once; the same again is a duplicate."""
    sender = sender_for(app, name)
    body = event_body(sender, "evt_1")
    headers = signed_headers(sender, body, "evt_1")
    first = post(client, sender, body, headers)
    assert first.status_code == 202, first.get_json()
    again = post(client, sender, body, headers)
    assert again.status_code == 202
    answers = [first.get_json(), again.get_json()]
    if PROFILES[name].body_format == "json-array":  # a batch of one
        answers = [a["events"][0] for a in answers]
    assert [a["status"] for a in answers] == ["accepted", "duplicate"]
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 0}


def test_hmac_profile_accepts_what_its_options_describe(app, client) -> None:
    """The hmac profile verifies sha512/base64/prefix/template/timestamp as configured."""
    sender = hmac_sender(app)
    body = b'{"hello": "world"}'
    now = str(int(time.time()))
    digest = hmac.new(b"acme-shared-secret", f"ev-1.{now}.".encode() + body,
                      hashlib.sha512).digest()
    import base64

    headers = {"X-Acme-Signature": "sha512=" + base64.b64encode(digest).decode(),
               "X-Acme-Timestamp": now, "X-Acme-Event": "ev-1", "X-Acme-Type": "acme.hello"}
    assert post(client, sender, body, headers).status_code == 202
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(receipts.c.event_type)).scalar_one() == "acme.hello"
    headers["X-Acme-Event"] = "ev-2"  # the id is in the signed content: a swap breaks it
    assert post(client, sender, body, headers).status_code == 401


def _matrix(name: str, sender: Sender) -> list[tuple[str, bytes, dict[str, str], int]]:
    """The bad-input cases of the first intake issue, in this sender's shape."""
    profile = PROFILES[name]
    now = int(time.time())
    good_body = event_body(sender, "evt_9")
    cases = [("no signature headers", good_body, {"Content-Type": "application/json"}, 401)]
    other = OTHER_KEYS[name].signing
    cases.append(("another key", good_body,
                  signed_headers(sender, good_body, "evt_9", secret=other), 401))
    if name != "gitlab":  # GitLab's token signs nothing: see test_gitlab_token_signs_no_body
        tampered = good_body + (b"&x=1" if name == "twilio" else b" ")
        cases.append(("tampered body", tampered,
                      signed_headers(sender, good_body, "evt_9"), 401))
    if profile.has_timestamp:
        old_body = good_body
        if name == "linear":
            payload = json.loads(good_body)
            payload["webhookTimestamp"] -= 3_600_000
            old_body = json.dumps(payload).encode()
        cases.append(("stale timestamp", old_body,
                      signed_headers(sender, old_body, "evt_9", timestamp=now - 3600), 401))
    not_parsed = b"%%%" if name == "twilio" else b"not json"
    # Linear's freshness is inside the JSON body: no JSON, no proof of freshness.
    cases.append(("body not parseable", not_parsed,
                  signed_headers(sender, not_parsed, "evt_9"), 401 if name == "linear" else 400))
    if name not in ("zoom", "calendly"):  # their ids are made from the body
        bad_id = event_body(sender, "has space")
        cases.append(("bad event id", bad_id, signed_headers(sender, bad_id, "has space"), 400))
    if name != "twilio":  # Twilio's type is fixed per integration
        bad_type = event_body(sender, "evt_9", "bad type")
        cases.append(("bad event type", bad_type,
                      signed_headers(sender, bad_type, "evt_9", "bad type"), 400))
    return cases


@pytest.mark.parametrize("name", ALL)
def test_bad_input_matrix_writes_nothing(app, client, name: str) -> None:
    """Every refusal answers its status with a JSON error and writes no row at all."""
    sender = sender_for(app, name)
    for label, body, headers, status in _matrix(name, sender):
        response = post(client, sender, body, headers)
        assert response.status_code == status, (label, response.get_json())
        expected = "unauthenticated" if status == 401 else "invalid_event"
        assert response.get_json()["error"] == expected, label
        assert ledger_counts(app) == NOTHING, label


def test_gitlab_token_signs_no_body(app, client) -> None:
    """GitLab's documented limit: the token authenticates the sender, not the body."""
    sender = sender_for(app, "gitlab")
    body = event_body(sender, "evt_1", "push")
    headers = signed_headers(sender, body, "evt_1", "push")
    assert headers["X-Gitlab-Token"] == KEYS["gitlab"].signing
    assert post(client, sender, body.replace(b"push", b"tag_push"), headers).status_code == 202


# --- handshakes -----------------------------------------------------------------------


def _handshake(client: Any, sender: Sender, payload: dict[str, Any], *,
               secret: str | None = None) -> Any:
    body = json.dumps(payload).encode()
    return post(client, sender, body, signed_headers(sender, body, "x", secret=secret))


def test_slack_url_verification_is_answered_after_authentication(app, client) -> None:
    """Slack's challenge gets {"challenge": C} at once; forged, it gets 401; nothing written."""
    sender = sender_for(app, "slack")
    challenge = {"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
                 "type": "url_verification"}
    answer = _handshake(client, sender, challenge)
    assert (answer.status_code, answer.get_json()) == (200, {"challenge": challenge["challenge"]})
    forged = _handshake(client, sender, challenge, secret=OTHER_KEYS["slack"].signing)
    assert (forged.status_code, forged.get_json()) == (401, {"error": "unauthenticated"})
    assert ledger_counts(app) == NOTHING


def test_zoom_url_validation_answers_the_hashed_token(app, client) -> None:
    """Zoom's endpoint.url_validation gets plainToken and its HMAC-SHA256 under the secret."""
    sender = sender_for(app, "zoom")
    payload = {"payload": {"plainToken": "qgg8vlvZRS6UYooatFL8Aw"},
               "event_ts": 1654503849680, "event": "endpoint.url_validation"}
    answer = _handshake(client, sender, payload)
    expected = hmac.new(KEYS["zoom"].stored.encode(), b"qgg8vlvZRS6UYooatFL8Aw",
                        hashlib.sha256).hexdigest()
    assert answer.status_code == 200
    assert answer.get_json() == {"plainToken": "qgg8vlvZRS6UYooatFL8Aw",
                                 "encryptedToken": expected}
    unsigned = post(client, sender, json.dumps(payload).encode(),
                    {"Content-Type": "application/json"})
    assert unsigned.status_code == 401
    assert ledger_counts(app) == NOTHING


def test_discord_ping_gets_pong_only_when_signed(app, client) -> None:
    """Discord's PING (type 1) gets {"type": 1}; a bad signature gets 401 (Discord checks)."""
    sender = sender_for(app, "discord")
    answer = _handshake(client, sender, {"id": "1", "type": 1, "application_id": "2"})
    assert (answer.status_code, answer.get_json()) == (200, {"type": 1})
    forged = _handshake(client, sender, {"id": "1", "type": 1},
                        secret=OTHER_KEYS["discord"].signing)
    assert forged.status_code == 401
    assert ledger_counts(app) == NOTHING


# --- batches --------------------------------------------------------------------------


def _batch(sender: Sender, events: list[dict[str, Any]]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(events).encode()
    return body, signed_headers(sender, body, "batch")


def test_sendgrid_batch_gives_each_event_its_receipt_in_one_answer(app, client) -> None:
    """Three events: three receipts and jobs; resent, three duplicates; a changed one conflicts."""
    sender = sender_for(app, "sendgrid")
    events = [{"sg_event_id": f"sg_{i}", "event": "delivered", "email": "a@example.com"}
              for i in range(3)]
    body, headers = _batch(sender, events)
    first = post(client, sender, body, headers)
    assert first.status_code == 202
    assert first.get_json() == {"status": "batch", "events": [
        {"status": "accepted", "event_id": f"sg_{i}", "state": "pending"} for i in range(3)]}
    assert ledger_counts(app) == {"receipts": 3, "jobs": 3, "conflicts": 0}
    changed = [*events[:2], {**events[2], "event": "bounce"}]
    body, headers = _batch(sender, changed)
    second = post(client, sender, body, headers)
    assert second.status_code == 202  # two duplicates are still pending
    assert [e["status"] for e in second.get_json()["events"]] == ["duplicate", "duplicate",
                                                                   "conflict"]
    assert ledger_counts(app) == {"receipts": 3, "jobs": 3, "conflicts": 1}
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(conflicts.c.event_id)).scalar_one() == "sg_2"
        payloads = [json.loads(p) for p in conn.execute(
            select(jobs.c.payload).order_by(jobs.c.event_id)).scalars()]
    assert [p["sg_event_id"] for p in payloads] == ["sg_0", "sg_1", "sg_2"]


def test_one_invalid_batch_element_refuses_the_whole_batch(app, client) -> None:
    """A valid event beside one with a bad id: 400, and neither is written."""
    sender = sender_for(app, "sendgrid")
    for events in ([{"sg_event_id": "sg_ok", "event": "open"},
                    {"sg_event_id": "bad id", "event": "open"}],
                   [{"sg_event_id": "sg_ok", "event": "open"}, "not an object"], []):
        body, headers = _batch(sender, events)  # type: ignore[arg-type]
        response = post(client, sender, body, headers)
        assert response.status_code == 400, response.get_json()
        assert response.get_json()["error"] == "invalid_event"
    assert ledger_counts(app) == NOTHING


# --- form bodies ----------------------------------------------------------------------


def test_twilio_form_body_is_verified_raw_and_handed_over_decoded(app, client) -> None:
    """The job carries the decoded fields; a reordered replay under a new token is caught."""
    sender = sender_for(app, "twilio")
    fields = {"MessageSid": "SM1", "Body": "hello & bye", "From": "+15005550006"}
    body = urlencode(fields).encode()
    headers = signed_headers(sender, body, "idem-1")
    assert post(client, sender, body, headers).status_code == 202
    with app.extensions["ledger"].engine.connect() as conn:
        payload = json.loads(conn.execute(select(jobs.c.payload)).scalar_one())
        event_type = conn.execute(select(receipts.c.event_type)).scalar_one()
    assert payload == fields
    assert event_type == "twilio.request"
    reordered = urlencode(dict(reversed(fields.items()))).encode()
    replay = signed_headers(sender, reordered, "idem-2")
    assert replay["X-Twilio-Signature"] == headers["X-Twilio-Signature"]  # same parameters
    again = post(client, sender, reordered, replay)
    assert again.get_json() == {"status": "duplicate", "event_id": "idem-1", "state": "pending"}
    assert ledger_counts(app)["receipts"] == 1


# --- per-integration type settings ----------------------------------------------------


def test_type_path_reads_gitlab_style_object_kind(app, client) -> None:
    """Standard Webhooks signing with `object_kind` (GitLab): --type-path names it."""
    sender = sender_for(app, "standard-webhooks", type_path="object_kind")
    body = b'{"object_kind": "merge_request", "type": "ignored"}'
    response = post(client, sender, body, signed_headers(sender, body, "msg_1"))
    assert response.status_code == 202
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(receipts.c.event_type)).scalar_one() == "merge_request"


def test_event_type_is_fixed_and_untyped_is_the_default(app, client) -> None:
    """--event-type fixes the type; without it a typeless body is `untyped`, not refused."""
    fixed = sender_for(app, "standard-webhooks", event_type="acme.ping")
    plain = make_sender(app, name="plain", profile="standard-webhooks")
    body = b'{"test": 2432232314}'
    for sender in (fixed, plain):
        response = post(client, sender, body, signed_headers(sender, body, "msg_1"))
        assert response.status_code == 202, response.get_json()
    with app.extensions["ledger"].engine.connect() as conn:
        types = conn.execute(select(receipts.c.event_type).order_by(receipts.c.scope_id)).all()
    assert [t for (t,) in types] == ["acme.ping", "untyped"]
    assert deliver(client, plain, "msg_2", body=b'{"type": 5}').status_code == 400
