"""The senders' own libraries on what is not a plain JSON event: Slack slash commands and
interactivity (forms), Twilio JSON bodies (`bodySHA256`) and shared-key HMAC-SHA256, and
Discord Webhook Events.

slack_sdk's SignatureVerifier, twilio's RequestValidator, discord-interactions and PyNaCl
sign what we verify and verify what we sign, with bodies shaped like the senders' documented
examples.
"""

from __future__ import annotations

import hashlib
import json
import time
from urllib.parse import urlencode

import discord_interactions
import pytest
from nacl.signing import SigningKey
from slack_sdk.signature import SignatureVerifier
from twilio.request_validator import (
    HMAC_SHA256,
    SIGNATURE_SETTINGS_HEADER,
    RequestValidator,
    get_signature_algorithm,
)

from ledger.errors import AuthenticationFailed
from ledger.intake.pipeline import parse_body
from ledger.intake.signatures import PROFILES, HeaderMap
from tests.profile_keys import KEYS, URL, configured

TOL = 300
FORM = "application/x-www-form-urlencoded"

# Slack's documented slash command (api.slack.com/interactivity/slash-commands).
SLASH_COMMAND = {
    "token": "gIkuvaNzQIHg97ATvDxqgjtO", "team_id": "T0001", "team_domain": "example",
    "enterprise_id": "E0001", "enterprise_name": "Globular Construct Inc",
    "channel_id": "C2147483705", "channel_name": "test", "user_id": "U2147483697",
    "user_name": "Steve", "command": "/weather", "text": "94070",
    "response_url": "https://hooks.slack.com/commands/1234/5678",
    "trigger_id": "13345224609.738474920.8088930838d88f008e0", "api_app_id": "A123456",
}
# A block_actions interaction (api.slack.com/reference/interaction-payloads/block-actions).
BLOCK_ACTIONS = {
    "type": "block_actions", "team": {"id": "T9TK3CUKW", "domain": "example"},
    "user": {"id": "UA8RXUSPL", "username": "jtorrance", "team_id": "T9TK3CUKW"},
    "api_app_id": "AABA1ABCD", "token": "9s8d9as89d8as9d8as989",
    "container": {"type": "message_attachment", "message_ts": "1548261231.000200",
                  "attachment_id": 1, "channel_id": "CBR2V3XEX", "is_ephemeral": False},
    "trigger_id": "12321423423.333649436676.d8c1bb837935619ccad0f624c448ffb3",
    "channel": {"id": "CBR2V3XEX", "name": "review-updates"},
    "response_url": "https://hooks.slack.com/actions/AABA1ABCD/1232321423432/D09sSasdasdAS9",
    "actions": [{"action_id": "WaXA", "block_id": "=qXel", "text": {"type": "plain_text",
                 "text": "View", "emoji": True}, "value": "click_me_123", "type": "button",
                 "action_ts": "1548426417.840180"}],
}


def received(headers: dict[str, str]) -> dict[str, list[str]]:
    """Return `headers` as the intake passes them: lower-case names, lists of values."""
    return {name.lower(): [value] for name, value in headers.items()}


def verifies(name: str, headers: HeaderMap, body: bytes, *, secret: str | None = None) -> int:
    """Return the index of the stored key that verified, under profile `name`."""
    return configured(name).verify(headers, body, [secret or KEYS[name].stored],
                                   now=int(time.time()), tolerance=TOL).secret_index


def refusal(name: str, headers: HeaderMap, body: bytes, *, secret: str | None = None) -> str:
    """Return the reason profile `name` refuses the delivery for."""
    with pytest.raises(AuthenticationFailed) as caught:
        verifies(name, headers, body, secret=secret)
    return caught.value.reason


# --- Slack: forms are signed like events ----------------------------------------------


def slack_sdk_headers(body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """Sign `body` as Slack does, with slack_sdk's SignatureVerifier."""
    now = str(timestamp or int(time.time()))
    signature = SignatureVerifier(KEYS["slack"].stored).generate_signature(timestamp=now,
                                                                          body=body)
    return {"X-Slack-Request-Timestamp": now, "X-Slack-Signature": signature,
            "Content-Type": FORM}


@pytest.mark.parametrize("body", [
    urlencode(SLASH_COMMAND).encode(),
    urlencode({"payload": json.dumps(BLOCK_ACTIONS)}).encode(),
], ids=["slash-command", "interactivity"])
def test_slack_sdk_signed_forms_verify_and_ours_pass_slack_sdk(body: bytes) -> None:
    """slack_sdk signs a form body over its raw bytes; we verify it, and it accepts ours."""
    assert verifies("slack", received(slack_sdk_headers(body)), body) == 0
    ours = PROFILES["slack"].sign(KEYS["slack"].stored, body, event_id="x", event_type="x",
                                  timestamp=int(time.time()))
    assert SignatureVerifier(KEYS["slack"].stored).is_valid(
        body, ours["X-Slack-Request-Timestamp"], ours["X-Slack-Signature"])
    # The raw bytes are signed: the same fields in another order do not verify.
    reordered = "&".join(reversed(body.decode().split("&"))).encode()
    if reordered != body:
        assert refusal("slack", received(slack_sdk_headers(body)), reordered) == "bad_signature"


def identity(name: str, body: bytes, content_type: str) -> tuple[object, object]:
    """Return the (id, type) a delivery of `body` is recorded under, as the intake decodes it."""
    profile = PROFILES[name]
    headers = received({"Content-Type": content_type})
    payload = parse_body(profile.format_of(headers), body, json_field=profile.form_json_field)
    found = profile.identity(headers, payload, body)
    return found.event_id, found.event_type


def test_slack_slash_command_is_its_trigger_id_and_interactions_their_payload_type() -> None:
    """A command is `slash_command` under its trigger_id; an interaction is its payload type."""
    command = urlencode(SLASH_COMMAND).encode()
    assert identity("slack", command, FORM) == (SLASH_COMMAND["trigger_id"], "slash_command")
    action = urlencode({"payload": json.dumps(BLOCK_ACTIONS)}).encode()
    assert identity("slack", action, FORM) == (BLOCK_ACTIONS["trigger_id"], "block_actions")
    for kind in ("view_submission", "shortcut", "message_action"):
        body = urlencode({"payload": json.dumps({**BLOCK_ACTIONS, "type": kind})}).encode()
        assert identity("slack", body, FORM) == (BLOCK_ACTIONS["trigger_id"], kind)


def test_slack_interaction_without_trigger_id_is_named_by_its_signed_body() -> None:
    """view_closed carries no trigger_id: the id is made from the signed body (sl_ + digest)."""
    closed = {"type": "view_closed", "team": {"id": "T1"}, "user": {"id": "U1"},
              "view": {"id": "V1", "callback_id": "modal-1"}, "is_cleared": False}
    body = urlencode({"payload": json.dumps(closed)}).encode()
    assert identity("slack", body, FORM) == (
        "sl_" + hashlib.sha256(body).hexdigest()[:40], "view_closed")


def test_slack_events_api_json_keeps_its_event_id_and_inner_type() -> None:
    """Events API bodies are unchanged: event_id, and event.type inside event_callback."""
    body = json.dumps({"type": "event_callback", "event_id": "Ev1",
                       "event": {"type": "app_mention"}}).encode()
    assert identity("slack", body, "application/json") == ("Ev1", "app_mention")
    assert identity("slack", body, "") == ("Ev1", "app_mention")  # no Content-Type: JSON


# --- Twilio: JSON bodies and shared keys ----------------------------------------------


TWILIO_JSON = '{"CallSid":"CA1234567890ABCDE","Caller":"+12349013030"}'


def test_twilio_json_body_signed_with_body_sha256_verifies_like_the_request_validator() -> None:
    """Twilio signs the URL + ?bodySHA256=<hex>; RequestValidator and we agree on it."""
    validator = RequestValidator(KEYS["twilio"].stored)
    called = f"{URL}?bodySHA256={validator.compute_hash(TWILIO_JSON)}"
    signature = validator.compute_signature(called, {})
    assert validator.validate(called, TWILIO_JSON, signature)
    headers = received({"X-Twilio-Signature": signature, "Content-Type": "application/json"})
    assert verifies("twilio", headers, TWILIO_JSON.encode()) == 0
    tampered = TWILIO_JSON.replace("1303", "1304").encode()
    assert not validator.validate(called, tampered.decode(), signature)
    assert refusal("twilio", headers, tampered) == "bad_signature"
    # The same body posted as a form is checked as a form, and fails.
    form = received({"X-Twilio-Signature": signature, "Content-Type": FORM})
    assert refusal("twilio", form, TWILIO_JSON.encode()) == "bad_signature"


def test_twilio_python_suite_vector_for_a_json_body() -> None:
    """twilio-python's own test case: auth token 12345, a URL with a query, a JSON body."""
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    body = '{"property": "value", "boolean": true}'
    signature = "a9nBmqA0ju/hNViExpshrM61xv4="  # tests/unit/test_request_validator.py
    validator = RequestValidator("12345")
    assert validator.validate(f"{url}&bodySHA256={validator.compute_hash(body)}", body, signature)
    headers = received({"X-Twilio-Signature": signature, "Content-Type": "application/json"})
    profile = PROFILES["twilio"].configured(url=url)
    assert profile.verify(headers, body.encode(), ["12345"], now=0, tolerance=TOL).secret_index == 0
    with pytest.raises(AuthenticationFailed):
        profile.verify(headers, body.encode() + b" ", ["12345"], now=0, tolerance=TOL)


def test_slack_documented_request_is_a_slash_command_under_its_trigger_id() -> None:
    """Slack's signing example is a slash command: it is recorded under its trigger_id."""
    from tests.unit.test_sender_libraries import SLACK_DOC_BODY

    assert identity("slack", SLACK_DOC_BODY, FORM) == (
        "398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c", "slash_command")


def test_twilio_url_with_a_query_gets_body_sha256_appended() -> None:
    """A configured URL with its own query is signed with `&bodySHA256=…` after it."""
    url = URL + "?tenant=acme"
    validator = RequestValidator(KEYS["twilio"].stored)
    called = f"{url}&bodySHA256={validator.compute_hash(TWILIO_JSON)}"
    assert validator.validate(called, TWILIO_JSON, validator.compute_signature(called, {}))
    headers = received({"X-Twilio-Signature": validator.compute_signature(called, {}),
                        "Content-Type": "application/json; charset=utf-8"})
    profile = PROFILES["twilio"].configured(url=url)
    assert profile.verify(headers, TWILIO_JSON.encode(), [KEYS["twilio"].stored],
                          now=0, tolerance=TOL).secret_index == 0


PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
          "From": "+12349013030", "To": "+18005551212"}
SHARED_KEY = "twilio-shared-key-secret"


def test_twilio_shared_key_hmac_sha256_verifies_with_the_settings_header() -> None:
    """A SharedKey signs HMAC-SHA256 and names it in the settings header; we follow the header."""
    settings = "key=webhooks_sharedkey_01jz,algorithm=HMAC_SHA256"
    assert get_signature_algorithm(settings) == HMAC_SHA256
    signature = RequestValidator(SHARED_KEY).compute_signature(URL, PARAMS, HMAC_SHA256)
    body = urlencode(PARAMS).encode()
    headers = received({"X-Twilio-Signature": signature, SIGNATURE_SETTINGS_HEADER: settings})
    # The integration holds the auth token and the shared key while it moves over.
    index = configured("twilio").verify(headers, body, [KEYS["twilio"].stored, SHARED_KEY],
                                        now=0, tolerance=TOL).secret_index
    assert index == 1
    assert RequestValidator(SHARED_KEY).validate(URL, PARAMS, signature, HMAC_SHA256)
    # Without the header the same signature is read as HMAC-SHA1, and fails.
    bare = received({"X-Twilio-Signature": signature})
    assert refusal("twilio", bare, body, secret=SHARED_KEY) == "malformed_signature"
    unknown = received({"X-Twilio-Signature": signature,
                        SIGNATURE_SETTINGS_HEADER: "key=k,algorithm=HMAC_SHA3"})
    assert refusal("twilio", unknown, body, secret=SHARED_KEY) == "no_supported_signature"
    assert not RequestValidator(SHARED_KEY).validate(URL, PARAMS, signature, "HMAC_SHA3")


def test_twilio_shared_key_sha1_and_the_auth_token_default() -> None:
    """`algorithm=HMAC_SHA1` (or no algorithm) keeps SHA-1, as get_signature_algorithm reads it."""
    body = urlencode(PARAMS).encode()
    signature = RequestValidator(SHARED_KEY).compute_signature(URL, PARAMS)
    for settings in ("key=k,algorithm=HMAC_SHA1", "key=k"):
        assert get_signature_algorithm(settings) == "HMAC_SHA1"
        headers = received({"X-Twilio-Signature": signature, SIGNATURE_SETTINGS_HEADER: settings})
        assert verifies("twilio", headers, body, secret=SHARED_KEY) == 0


# --- Discord: Webhook Events ----------------------------------------------------------


AUTHORIZED = {"version": 1, "application_id": "1234560123453231555", "type": 1,
              "event": {"type": "APPLICATION_AUTHORIZED", "timestamp": "2024-10-18T14:42:53.064834",
                        "data": {"integration_type": 1, "scopes": ["applications.commands"],
                                 "user": {"id": "11111111111111", "username": "Mason"}}}}


def test_discord_webhook_event_signed_with_pynacl_verifies_and_ours_passes_discord() -> None:
    """Webhook Events are signed like interactions: PyNaCl's signature verifies, ours passes."""
    body = json.dumps(AUTHORIZED).encode()
    now = str(int(time.time()))
    signature = SigningKey(bytes.fromhex(KEYS["discord"].signing)).sign(
        now.encode() + body).signature.hex()
    headers = received({"X-Signature-Ed25519": signature, "X-Signature-Timestamp": now})
    assert verifies("discord", headers, body) == 0
    assert refusal("discord", headers, body.replace(b"Mason", b"Eve")) == "bad_signature"
    ours = PROFILES["discord"].sign(KEYS["discord"].signing, body, event_id="x", event_type="x",
                                    timestamp=int(now))
    assert discord_interactions.verify_key(body, ours["X-Signature-Ed25519"],
                                           ours["X-Signature-Timestamp"], KEYS["discord"].stored)


def test_discord_webhook_event_id_is_made_from_its_body_and_interactions_keep_theirs() -> None:
    """No id in a Webhook Event: dc_ + the signed body's digest; its type is event.type."""
    body = json.dumps(AUTHORIZED).encode()
    assert identity("discord", body, "application/json") == (
        "dc_" + hashlib.sha256(body).hexdigest()[:40], "APPLICATION_AUTHORIZED")
    for code, name in ((2, "application_command"), (3, "message_component"),
                       (4, "application_command_autocomplete"), (5, "modal_submit")):
        interaction = json.dumps({"id": "786008729715212338", "application_id": "1",
                                  "type": code, "token": "t", "version": 1}).encode()
        assert identity("discord", interaction, "application/json") == (
            "786008729715212338", name)
