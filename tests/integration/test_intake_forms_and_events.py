"""Slack slash commands and interactivity, Discord interactions and Webhook Events, Twilio
JSON bodies and shared keys, over HTTP on both databases: accepted with CONTRACT section 2's
answer, form bodies verified raw and handed to handlers decoded, handshakes answered only
after authentication, and nothing written on any refusal."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from nacl.signing import SigningKey
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import select
from twilio.request_validator import HMAC_SHA256, SIGNATURE_SETTINGS_HEADER, RequestValidator

from ledger.access import audit
from ledger.access.credentials import add_credential
from ledger.access.integrations import get_integration
from ledger.db.schema import jobs, receipts
from tests.helpers import Sender, ledger_counts, make_sender
from tests.profile_keys import KEYS, OTHER_KEYS, URL
from tests.unit.test_sender_forms_and_events import AUTHORIZED, BLOCK_ACTIONS, SLASH_COMMAND

NOTHING = {"receipts": 0, "jobs": 0, "conflicts": 0}
FORM = "application/x-www-form-urlencoded"


def recorded(app: Any) -> list[tuple[str, str, Any]]:
    """Return (event id, type, job payload) of every receipt, oldest first."""
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(receipts.c.event_id, receipts.c.event_type, jobs.c.payload)
                            .join(jobs, (jobs.c.scope_id == receipts.c.scope_id)
                                  & (jobs.c.event_id == receipts.c.event_id))
                            .order_by(receipts.c.accepted_at)).all()
    return [(event_id, event_type, json.loads(payload)) for event_id, event_type, payload in rows]


# --- Slack ----------------------------------------------------------------------------


@pytest.fixture
def slack(app: Any) -> Sender:
    """A Slack app's integration, holding its signing secret."""
    return make_sender(app, name="slack-app", profile="slack", secret=KEYS["slack"].stored)


def slack_post(client: Any, sender: Sender, body: bytes, *, secret: str | None = None,
               timestamp: int | None = None, content_type: str = FORM) -> Any:
    """POST `body` signed by slack_sdk's SignatureVerifier, as Slack sends it."""
    now = str(timestamp or int(time.time()))
    key = secret or KEYS["slack"].stored
    try:
        signature = SignatureVerifier(key).generate_signature(timestamp=now, body=body)
    except UnicodeDecodeError:  # slack_sdk signs text only; Slack signs the bytes it sends
        signature = "v0=" + hmac.new(key.encode(), f"v0:{now}:".encode() + body,
                                     hashlib.sha256).hexdigest()
    headers = {"X-Slack-Request-Timestamp": now, "X-Slack-Signature": signature,
               "Content-Type": content_type}
    return client.post(f"/hooks/{sender.public_id}", data=body, headers=headers)


def test_slash_command_is_accepted_once_and_handed_over_decoded(app, client, slack) -> None:
    """A slash command: 202 under its trigger_id as `slash_command`; the job holds the fields."""
    body = urlencode(SLASH_COMMAND).encode()
    first = slack_post(client, slack, body)
    assert (first.status_code, first.get_json()) == (202, {
        "status": "accepted", "event_id": SLASH_COMMAND["trigger_id"], "state": "pending"})
    again = slack_post(client, slack, body)
    assert again.get_json()["status"] == "duplicate"
    assert recorded(app) == [(SLASH_COMMAND["trigger_id"], "slash_command", SLASH_COMMAND)]


def test_interactivity_payload_is_decoded_for_handlers(app, client, slack) -> None:
    """`payload=<JSON>`: the job holds the form with its payload decoded to an object."""
    body = urlencode({"payload": json.dumps(BLOCK_ACTIONS)}).encode()
    response = slack_post(client, slack, body)
    assert response.status_code == 202, response.get_json()
    closed = {"type": "view_closed", "team": {"id": "T1"}, "user": {"id": "U1"},
              "view": {"id": "V1"}, "is_cleared": True}
    closed_body = urlencode({"payload": json.dumps(closed)}).encode()
    assert slack_post(client, slack, closed_body).status_code == 202
    assert recorded(app) == [
        (BLOCK_ACTIONS["trigger_id"], "block_actions", {"payload": BLOCK_ACTIONS}),
        ("sl_" + hashlib.sha256(closed_body).hexdigest()[:40], "view_closed",
         {"payload": closed})]


def test_events_api_json_still_works_beside_forms(app, client, slack) -> None:
    """The Events API (JSON) keeps event_id and the inner type; url_verification answers."""
    body = json.dumps({"type": "event_callback", "event_id": "Ev08MFMKH6",
                       "event": {"type": "app_mention", "text": "hi"}}).encode()
    assert slack_post(client, slack, body, content_type="application/json").status_code == 202
    challenge = json.dumps({"type": "url_verification", "challenge": "c-1"}).encode()
    answer = slack_post(client, slack, challenge, content_type="application/json")
    assert (answer.status_code, answer.get_json()) == (200, {"challenge": "c-1"})
    assert [(i, t) for i, t, _ in recorded(app)] == [("Ev08MFMKH6", "app_mention")]


def test_ssl_check_is_answered_only_when_signed(app, client, slack) -> None:
    """Slack's ssl_check gets 200 and writes nothing; unsigned, it gets 401 like any request."""
    body = b"ssl_check=1&token=gIkuvaNzQIHg97ATvDxqgjtO"
    answer = slack_post(client, slack, body)
    assert (answer.status_code, answer.get_json()) == (200, {})
    unsigned = client.post(f"/hooks/{slack.public_id}", data=body,
                           headers={"Content-Type": FORM})
    assert unsigned.status_code == 401
    assert ledger_counts(app) == NOTHING


def test_slack_form_bad_input_writes_nothing(app, client, slack) -> None:
    """Forged, stale, tampered, id-less, undecodable forms: refused, nothing written."""
    good = urlencode(SLASH_COMMAND).encode()
    no_trigger = urlencode({k: v for k, v in SLASH_COMMAND.items() if k != "trigger_id"})
    cases = [
        ("another secret", good, {"secret": OTHER_KEYS["slack"].signing}, 401),
        ("stale", good, {"timestamp": int(time.time()) - 3600}, 401),
        ("no trigger_id", no_trigger.encode(), {}, 400),
        ("bad trigger_id", urlencode({**SLASH_COMMAND, "trigger_id": "a b"}).encode(), {}, 400),
        ("not a form", b"payload", {}, 400),
        ("not UTF-8", b"command=%2Fa&trigger_id=\xff", {}, 400),
        ("payload not JSON", b"payload=%7Bnope", {}, 400),
        ("payload not an object", urlencode({"payload": "[1]"}).encode(), {}, 400),
        ("payload duplicate key",
         urlencode({"payload": '{"type": "block_actions", "type": "shortcut"}'}).encode(), {}, 400),
        ("payload without type", urlencode({"payload": '{"trigger_id": "1.2.3"}'}).encode(), {},
         400),
    ]
    for label, body, how, status in cases:
        response = slack_post(client, slack, body, **how)
        assert response.status_code == status, (label, response.get_json())
        assert response.get_json()["error"] == ("unauthenticated" if status == 401
                                                else "invalid_event"), label
    tampered = client.post(f"/hooks/{slack.public_id}", data=good + b"&text=x", headers={
        "Content-Type": FORM, **_slack_headers(good)})
    assert tampered.status_code == 401
    assert ledger_counts(app) == NOTHING


def _slack_headers(body: bytes) -> dict[str, str]:
    now = str(int(time.time()))
    return {"X-Slack-Request-Timestamp": now, "X-Slack-Signature": SignatureVerifier(
        KEYS["slack"].stored).generate_signature(timestamp=now, body=body)}


# --- Discord --------------------------------------------------------------------------


@pytest.fixture
def discord(app: Any) -> Sender:
    """A Discord application's integration, holding its public key."""
    return make_sender(app, name="discord-app", profile="discord", secret=KEYS["discord"].stored,
                       signing_key=KEYS["discord"].signing)


def discord_post(client: Any, sender: Sender, payload: dict[str, Any], *,
                 seed: str | None = None, timestamp: int | None = None) -> Any:
    """POST `payload` signed with PyNaCl as Discord signs it."""
    body = json.dumps(payload).encode()
    now = str(timestamp or int(time.time()))
    signature = SigningKey(bytes.fromhex(seed or KEYS["discord"].signing)).sign(
        now.encode() + body).signature.hex()
    return client.post(f"/hooks/{sender.public_id}", data=body, headers={
        "X-Signature-Ed25519": signature, "X-Signature-Timestamp": now,
        "Content-Type": "application/json"})


def test_discord_interactions_are_accepted_under_their_id(app, client, discord) -> None:
    """Commands, components, autocomplete and modals get the 202 answer under their snowflake."""
    names = {2: "application_command", 3: "message_component",
             4: "application_command_autocomplete", 5: "modal_submit"}
    for code in names:
        interaction = {"id": f"78600872971521233{code}", "application_id": "1", "type": code,
                       "token": "A_UNIQUE_TOKEN", "version": 1, "data": {"name": "blep"}}
        response = discord_post(client, discord, interaction)
        assert (response.status_code, response.get_json()["status"]) == (202, "accepted")
    assert [(i, t) for i, t, _ in recorded(app)] == [
        (f"78600872971521233{code}", name) for code, name in names.items()]


def test_discord_webhook_events_ping_and_event(app, client, discord) -> None:
    """A Webhook Events PING gets 204 with no body; an event is accepted once under dc_…."""
    ping = discord_post(client, discord, {"version": 1, "application_id": "1", "type": 0})
    assert (ping.status_code, ping.data) == (204, b"")
    forged = discord_post(client, discord, {"version": 1, "application_id": "1", "type": 0},
                          seed=OTHER_KEYS["discord"].signing)
    assert forged.status_code == 401
    assert ledger_counts(app) == NOTHING
    first = discord_post(client, discord, AUTHORIZED)
    assert first.status_code == 202
    retry = discord_post(client, discord, AUTHORIZED, timestamp=int(time.time()) + 5)
    assert retry.get_json()["status"] == "duplicate"  # Discord retries the same event
    body = json.dumps(AUTHORIZED).encode()
    assert recorded(app) == [("dc_" + hashlib.sha256(body).hexdigest()[:40],
                              "APPLICATION_AUTHORIZED", AUTHORIZED)]


def test_discord_bad_input_writes_nothing(app, client, discord) -> None:
    """Stale, forged, unknown interaction type, event without a type: refused, nothing written."""
    now = int(time.time())
    cases = [
        ("stale", AUTHORIZED, {"timestamp": now - 3600}, 401),
        ("another key", AUTHORIZED, {"seed": OTHER_KEYS["discord"].signing}, 401),
        ("unknown interaction type", {"id": "1", "type": 9, "token": "t"}, {}, 400),
        ("event without type", {**AUTHORIZED, "event": {"timestamp": "2024-10-18"}}, {}, 400),
        ("interaction without id", {"type": 2, "token": "t"}, {}, 400),
    ]
    for label, payload, how, status in cases:
        response = discord_post(client, discord, payload, **how)
        assert response.status_code == status, (label, response.get_json())
    assert ledger_counts(app) == NOTHING


# --- Twilio ---------------------------------------------------------------------------


@pytest.fixture
def twilio(app: Any) -> Sender:
    """A Twilio account's integration, holding its auth token and endpoint URL."""
    return make_sender(app, name="twilio-app", profile="twilio", secret=KEYS["twilio"].stored,
                       endpoint_url=URL)


def test_twilio_json_body_is_accepted_and_kept_as_json(app, client, twilio) -> None:
    """A JSON body signed with bodySHA256 is accepted; the job holds the JSON object."""
    body = '{"CallSid":"CA1234567890ABCDE","Caller":"+12349013030"}'
    validator = RequestValidator(KEYS["twilio"].stored)
    signature = validator.compute_signature(f"{URL}?bodySHA256={validator.compute_hash(body)}",
                                            {})
    headers = {"X-Twilio-Signature": signature, "I-Twilio-Idempotency-Token": "idem-json",
               "Content-Type": "application/json"}
    response = client.post(f"/hooks/{twilio.public_id}", data=body, headers=headers)
    assert response.status_code == 202, response.get_json()
    tampered = client.post(f"/hooks/{twilio.public_id}", data=body.replace("CA1", "CA2"),
                           headers={**headers, "I-Twilio-Idempotency-Token": "idem-2"})
    assert tampered.status_code == 401
    assert recorded(app) == [("idem-json", "twilio.request", json.loads(body))]


def test_twilio_shared_key_signs_beside_the_auth_token(app, client, twilio) -> None:
    """A SharedKey added as a second credential verifies HMAC-SHA256 deliveries."""
    svc = app.extensions["ledger"]
    shared = "twilio-shared-key-secret"
    with svc.engine.begin() as conn:
        add_credential(conn, svc.box, audit.Actor(name="test", role="admin"),
                       get_integration(conn, twilio.public_id), now=svc.clock.now(),
                       secret=shared)
    params = {"MessageSid": "SM1", "Body": "hello"}
    signature = RequestValidator(shared).compute_signature(URL, params, HMAC_SHA256)
    headers = {"X-Twilio-Signature": signature, "I-Twilio-Idempotency-Token": "idem-sk",
               SIGNATURE_SETTINGS_HEADER: "key=webhooks_sharedkey_1,algorithm=HMAC_SHA256",
               "Content-Type": FORM}
    response = client.post(f"/hooks/{twilio.public_id}", data=urlencode(params), headers=headers)
    assert response.status_code == 202, response.get_json()
    unnamed = {k: v for k, v in headers.items() if k != SIGNATURE_SETTINGS_HEADER}
    refused = client.post(f"/hooks/{twilio.public_id}", data=urlencode(params),
                          headers={**unnamed, "I-Twilio-Idempotency-Token": "idem-x"})
    assert refused.status_code == 401
    assert [(i, p) for i, _, p in recorded(app)] == [("idem-sk", params)]
