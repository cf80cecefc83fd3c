"""Interoperability with the senders' own code: their libraries sign, ours verify, and back.

Each library is the sender's published SDK from PyPI (the `test` extra): svix and
standardwebhooks, stripe, slack_sdk, twilio, sendgrid, paddle-python-sdk,
squareup, discord-interactions, PyNaCl for ed25519. Senders without a Python
library (Shopify, Linear, PagerDuty, Zoom, GitLab) are checked against their
documented formula in test_profile_vectors.py.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from urllib.parse import urlencode

import discord_interactions
import pytest
import standardwebhooks
import stripe
import svix.webhooks
from nacl.signing import SigningKey, VerifyKey
from paddle_billing.Notifications.PaddleSignature import PaddleSignature
from paddle_billing.Notifications.Secret import Secret
from sendgrid.helpers.eventwebhook import EventWebhook
from slack_sdk.signature import Clock, SignatureVerifier
from square.utils.webhooks_helper import verify_signature as square_verify
from twilio.request_validator import RequestValidator

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import PROFILES, HeaderMap
from tests.profile_keys import KEYS, URL, V1A, V1A_OTHER, configured

TOL = 300
BODY = b'{"id":"evt_1","type":"demo.credit","data":{"amount":5}}'


def received(headers: dict[str, str]) -> dict[str, list[str]]:
    """Return `headers` as the intake passes them: lower-case names, lists of values."""
    return {name.lower(): [value] for name, value in headers.items()}


def verifies(name: str, headers: HeaderMap, body: bytes = BODY, *, now: int | None = None,
             secrets: list[str] | None = None) -> int:
    """Return the index of the stored key that verified, under profile `name`."""
    stored = [KEYS[name].stored] if secrets is None else secrets
    return configured(name).verify(headers, body, stored, now=now or int(time.time()),
                                   tolerance=TOL).secret_index


def refusal(name: str, headers: HeaderMap, body: bytes = BODY, *, now: int | None = None,
            secrets: list[str] | None = None) -> str:
    """Return the reason profile `name` refuses the delivery for."""
    with pytest.raises(AuthenticationFailed) as caught:
        verifies(name, headers, body, now=now, secrets=secrets)
    return caught.value.reason


def ours(name: str, body: bytes = BODY, *, signing: str | None = None,
         timestamp: int | None = None, event_id: str = "evt_1") -> dict[str, str]:
    """Return the headers our sign() makes for `body`."""
    return configured(name).sign(signing or KEYS[name].signing, body, event_id=event_id,
                                 event_type="demo.credit",
                                 timestamp=timestamp or int(time.time()))


# --- Standard Webhooks and Svix -------------------------------------------------------

SW = "standard-webhooks"
SW_SECRET = KEYS[SW].stored


def svix_headers(msg_id: str, timestamp: int, body: bytes, prefix: str = "svix") -> dict:
    """Return the headers Svix sends, signed by the svix library."""
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    signature = svix.webhooks.Webhook(SW_SECRET).sign(msg_id, moment, body.decode())
    return {f"{prefix}-id": msg_id, f"{prefix}-timestamp": str(timestamp),
            f"{prefix}-signature": signature}


@pytest.mark.parametrize("prefix", ["svix", "webhook"])
def test_svix_library_signature_verifies_under_either_header_set(prefix: str) -> None:
    """Resend and Clerk deliver with svix-* headers; both sets verify, the id follows the set."""
    headers = received(svix_headers("msg_svix", int(time.time()), BODY, prefix))
    assert verifies(SW, headers) == 0
    identity = PROFILES[SW].identity(headers, json.loads(BODY), BODY)
    assert identity.event_id == "msg_svix"


def test_our_signature_passes_the_svix_library_under_svix_names() -> None:
    """Our webhook-* headers renamed to svix-* pass svix's own verify."""
    sent = ours(SW)
    renamed = {name.replace("webhook-", "svix-"): value for name, value in sent.items()}
    svix.webhooks.Webhook(SW_SECRET).verify(BODY, renamed)
    standardwebhooks.Webhook(SW_SECRET).verify(BODY, sent)


def test_both_header_sets_naming_different_messages_are_refused() -> None:
    """Two header sets naming different ids: which one is authoritative is ambiguous."""
    now = int(time.time())
    headers = received({**svix_headers("msg_a", now, BODY), **svix_headers("msg_b", now, BODY,
                                                                          "webhook")})
    assert refusal(SW, headers) == "duplicate_header"


def test_svix_signature_with_a_webhook_id_beside_it_uses_the_svix_id() -> None:
    """The id is taken from the set that carries the signature, never mixed."""
    now = int(time.time())
    headers = received({**svix_headers("msg_a", now, BODY), "webhook-id": "msg_forged"})
    assert verifies(SW, headers) == 0
    assert PROFILES[SW].identity(headers, {}, BODY).event_id == "msg_a"


@pytest.mark.parametrize(
    "signature",
    [
        "v1,bm90IGEgc2lnbmF0dXJl {good}",  # a wrong entry before a valid one
        "v1,!!!not-base64 {good}",  # a malformed entry before a valid one
        "v2,{good_value} {good}",  # an unknown version
        "{good} v1a,bm90IGEgc2lnbmF0dXJl",
    ],
)
def test_library_cases_with_several_entries(signature: str) -> None:
    """The standardwebhooks suites' multi-signature cases: one valid entry is enough."""
    now = int(time.time())
    good = svix_headers("msg_1", now, BODY, "webhook")
    value = good["webhook-signature"]
    good["webhook-signature"] = signature.format(good=value, good_value=value.split(",")[1])
    assert verifies(SW, received(good)) == 0


def test_standard_webhooks_spec_vector_authenticates_without_a_type() -> None:
    """The spec's vector body has no `type`: it verifies, and its type reads `untyped`."""
    body = b'{"test": 2432232314}'
    headers = received({"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
                        "webhook-timestamp": "1614265330",
                        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="})
    assert verifies(SW, headers, body, now=1614265330) == 0
    assert PROFILES[SW].identity(headers, json.loads(body), body).event_type == "untyped"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"webhook-timestamp": "1614265030"}, "bad_signature"),  # signed content changed
        ({"webhook-id": "msg_other"}, "bad_signature"),
        ({"webhook-signature": None}, "missing_signature"),
        ({"webhook-id": None}, "missing_id"),
        ({"webhook-timestamp": None}, "missing_timestamp"),
    ],
)
def test_library_suite_refusals(change: dict[str, str | None], reason: str) -> None:
    """The standardwebhooks suites' refusals: tampered headers, missing headers."""
    headers = svix_headers("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, BODY, "webhook")
    for name, value in change.items():
        if value is None:
            headers.pop(name)
        else:
            headers[name] = value
    assert refusal(SW, received(headers), now=1614265330) == reason


@pytest.mark.parametrize(("offset", "reason"), [(-TOL - 1, "stale_timestamp"),
                                                (TOL + 1, "future_timestamp")])
def test_svix_signed_old_and_future_messages_are_refused(offset: int, reason: str) -> None:
    """A genuine svix signature outside the window is refused."""
    now = int(time.time())
    assert refusal(SW, received(svix_headers("msg_1", now + offset, BODY)), now=now) == reason


def v1a_signature(seed_key: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Sign a v1a entry with PyNaCl, as the Standard Webhooks spec describes."""
    seed = base64.b64decode(seed_key.removeprefix("whsk_"))
    message = f"{msg_id}.{timestamp}.".encode() + body
    return "v1a," + base64.b64encode(SigningKey(seed).sign(message).signature).decode()


def test_v1a_only_delivery_verifies_with_a_whpk_key() -> None:
    """An ed25519 (v1a) signature made by PyNaCl verifies under the whpk_ public key."""
    now = int(time.time())
    headers = received({"webhook-id": "msg_1", "webhook-timestamp": str(now),
                        "webhook-signature": v1a_signature(V1A.signing, "msg_1", now, BODY)})
    assert verifies(SW, headers, secrets=[V1A.stored]) == 0
    assert refusal(SW, headers, secrets=[V1A_OTHER.stored]) == "bad_signature"
    assert refusal(SW, headers, secrets=[SW_SECRET]) == "bad_signature"  # a whsec_ key: no


def test_our_v1a_signature_passes_pynacl() -> None:
    """Our v1a entry (signed with whsk_) is a valid ed25519 signature of the spec's content."""
    now = int(time.time())
    sent = ours(SW, signing=V1A.signing, timestamp=now, event_id="msg_9")
    version, signature = sent["webhook-signature"].split(",")
    public = base64.b64decode(V1A.stored.removeprefix("whpk_"))
    VerifyKey(public).verify(f"msg_9.{now}.".encode() + BODY, base64.b64decode(signature))
    assert version == "v1a"


def test_v1_and_v1a_side_by_side_rotate_between_secret_kinds() -> None:
    """A whsec_ and a whpk_ key live together (rotation); each verifies its own entry."""
    now = int(time.time())
    hmac_entry = svix_headers("msg_1", now, BODY, "webhook")["webhook-signature"]
    both = f"{v1a_signature(V1A.signing, 'msg_1', now, BODY)} {hmac_entry}"
    headers = received({"webhook-id": "msg_1", "webhook-timestamp": str(now),
                        "webhook-signature": both})
    assert verifies(SW, headers, secrets=[V1A_OTHER.stored, SW_SECRET]) == 1
    assert verifies(SW, headers, secrets=[V1A.stored, SW_SECRET]) == 0


# --- Stripe ---------------------------------------------------------------------------


def stripe_header(timestamp: int, secret: str = KEYS["stripe"].stored) -> str:
    """Return a Stripe-Signature made by stripe-python's own helper."""
    return stripe.WebhookSignature.generate_signature_header(BODY.decode(), secret,
                                                             timestamp=timestamp)


def test_stripe_valid_signature_beside_potato_verifies_in_both() -> None:
    """stripe-python's own case: `t=…,v1=<valid>,v1=potato` verifies; so does ours."""
    now = int(time.time())
    header = stripe_header(now) + ",v1=potato"
    assert stripe.WebhookSignature.verify_header(BODY.decode(), header, KEYS["stripe"].stored,
                                                 TOL)
    assert verifies("stripe", received({"Stripe-Signature": header})) == 0


def test_our_stripe_header_passes_the_stripe_library() -> None:
    """Our Stripe-Signature passes stripe.WebhookSignature.verify_header."""
    header = ours("stripe")["Stripe-Signature"]
    assert stripe.WebhookSignature.verify_header(BODY.decode(), header, KEYS["stripe"].stored,
                                                 TOL)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("i'm not even a real signature header", "missing_timestamp"),
        ("t={now},v0={sig}", "no_supported_signature"),  # no signature with the v1 scheme
        ("t={now},v1=bad_signature", "malformed_signature"),
        ("t={now},v1={other}", "bad_signature"),  # signed with another secret
        ("t={old},v1={old_sig}", "stale_timestamp"),  # outside the tolerance
    ],
)
def test_stripe_library_suite_refusals(header: str, reason: str) -> None:
    """stripe-python's refusals, and what our verify says about each."""
    now = int(time.time())
    sig = stripe_header(now).split("v1=")[1]
    other = stripe_header(now, "whsec_not_the_secret").split("v1=")[1]
    old_sig = stripe_header(now - TOL - 10).split("v1=")[1]
    value = header.format(now=now, sig=sig, other=other, old=now - TOL - 10, old_sig=old_sig)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(BODY.decode(), value, KEYS["stripe"].stored, TOL)
    assert refusal("stripe", received({"Stripe-Signature": value})) == reason


def test_stripe_tampered_body_is_refused() -> None:
    """A body changed after signing fails in the library and in ours."""
    header = stripe_header(int(time.time()))
    assert refusal("stripe", received({"Stripe-Signature": header}), BODY + b" ") == \
        "bad_signature"


# --- Slack ----------------------------------------------------------------------------


class FixedClock(Clock):
    """slack_sdk's clock, frozen."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        """Return the frozen instant."""
        return self.at


SLACK_DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id="
    b"G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook"
    b"-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700"
    b"885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c"
    b"447fce8b6703c")


def test_slack_documentation_vector() -> None:
    """Slack's documented example (signing secret, timestamp, body) verifies."""
    headers = received({
        "X-Slack-Request-Timestamp": "1531420618",
        "X-Slack-Signature":
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"})
    assert verifies("slack", headers, SLACK_DOC_BODY, now=1531420618) == 0
    verifier = SignatureVerifier(KEYS["slack"].stored, clock=FixedClock(1531420618))
    assert verifier.is_valid(SLACK_DOC_BODY, "1531420618", headers["x-slack-signature"][0])


def test_slack_sdk_signature_verifies_and_ours_passes_slack_sdk() -> None:
    """slack_sdk's SignatureVerifier signs what we verify, and accepts what we sign."""
    now = int(time.time())
    verifier = SignatureVerifier(KEYS["slack"].stored, clock=FixedClock(now))
    signature = verifier.generate_signature(timestamp=str(now), body=BODY)
    assert verifies("slack", received({"X-Slack-Request-Timestamp": str(now),
                                       "X-Slack-Signature": signature})) == 0
    sent = ours("slack", timestamp=now)
    assert verifier.is_valid(BODY, sent["X-Slack-Request-Timestamp"], sent["X-Slack-Signature"])


def test_slack_old_request_is_refused_like_slack_sdk() -> None:
    """slack_sdk refuses a request older than five minutes; so do we."""
    now = int(time.time())
    sent = ours("slack", timestamp=now - TOL - 1)
    verifier = SignatureVerifier(KEYS["slack"].stored, clock=FixedClock(now))
    assert not verifier.is_valid(BODY, sent["X-Slack-Request-Timestamp"],
                                 sent["X-Slack-Signature"])
    assert refusal("slack", received(sent), now=now) == "stale_timestamp"


# --- Twilio ---------------------------------------------------------------------------

TWILIO_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
                 "From": "+12349013030", "To": "+18005551212"}


def test_twilio_request_validator_signature_verifies() -> None:
    """twilio's RequestValidator signs URL + sorted params; we verify the form body."""
    body = urlencode(TWILIO_PARAMS).encode()
    signature = RequestValidator(KEYS["twilio"].stored).compute_signature(URL, TWILIO_PARAMS)
    assert verifies("twilio", received({"X-Twilio-Signature": signature}), body) == 0


def test_our_twilio_signature_passes_the_request_validator() -> None:
    """Our X-Twilio-Signature passes RequestValidator.validate for the same URL and params."""
    body = urlencode(TWILIO_PARAMS).encode()
    sent = ours("twilio", body)
    assert RequestValidator(KEYS["twilio"].stored).validate(URL, TWILIO_PARAMS,
                                                            sent["X-Twilio-Signature"])


def test_twilio_signature_binds_the_url_and_the_parameters() -> None:
    """Another URL, a changed parameter, a wrong token: each is refused."""
    body = urlencode(TWILIO_PARAMS).encode()
    validator = RequestValidator(KEYS["twilio"].stored)
    other_url = validator.compute_signature(URL + "?x=1", TWILIO_PARAMS)
    assert refusal("twilio", received({"X-Twilio-Signature": other_url}), body) == \
        "bad_signature"
    good = validator.compute_signature(URL, TWILIO_PARAMS)
    tampered = urlencode({**TWILIO_PARAMS, "Digits": "9999"}).encode()
    assert refusal("twilio", received({"X-Twilio-Signature": good}), tampered) == "bad_signature"
    wrong = RequestValidator("54321").compute_signature(URL, TWILIO_PARAMS)
    assert refusal("twilio", received({"X-Twilio-Signature": wrong}), body) == "bad_signature"


def test_twilio_needs_the_configured_url() -> None:
    """Without the endpoint URL the signature cannot be checked: refused, never guessed."""
    body = urlencode(TWILIO_PARAMS).encode()
    signature = RequestValidator(KEYS["twilio"].stored).compute_signature(URL, TWILIO_PARAMS)
    with pytest.raises(AuthenticationFailed) as caught:
        PROFILES["twilio"].verify(received({"X-Twilio-Signature": signature}), body,
                                  [KEYS["twilio"].stored], now=0, tolerance=TOL)
    assert caught.value.reason == "no_endpoint_url"


# --- SendGrid -------------------------------------------------------------------------

SENDGRID_BODY = (b'[{"email":"example@test.com","event":"processed","sg_event_id":"rbtnWrG1DVD'
                 b'GGGFHFyun0A==","timestamp":1588777600}]')


def test_our_sendgrid_signature_passes_the_sendgrid_helper() -> None:
    """sendgrid's EventWebhook verifies the signature we make with the private key."""
    now = int(time.time())
    sent = ours("sendgrid", SENDGRID_BODY, timestamp=now)
    helper = EventWebhook(KEYS["sendgrid"].stored)
    assert helper.verify_signature(SENDGRID_BODY.decode(),
                                   sent["X-Twilio-Email-Event-Webhook-Signature"], str(now))
    assert verifies("sendgrid", received(sent), SENDGRID_BODY) == 0


def test_sendgrid_refuses_a_tampered_batch_and_a_foreign_key() -> None:
    """A changed body and another account's key fail in sendgrid's helper and in ours."""
    now = int(time.time())
    sent = ours("sendgrid", SENDGRID_BODY, timestamp=now)
    tampered = SENDGRID_BODY.replace(b"processed", b"delivered")
    helper = EventWebhook(KEYS["sendgrid"].stored)
    assert not helper.verify_signature(tampered.decode(),
                                       sent["X-Twilio-Email-Event-Webhook-Signature"], str(now))
    assert refusal("sendgrid", received(sent), tampered) == "bad_signature"
    from tests.profile_keys import OTHER_KEYS

    assert refusal("sendgrid", received(sent), SENDGRID_BODY,
                   secrets=[OTHER_KEYS["sendgrid"].stored]) == "bad_signature"


# --- Paddle, Square, Discord ----------------------------------------------------------

PADDLE_BODY = b'{"event_id":"evt_01h","event_type":"transaction.completed","data":{}}'


def test_paddle_sdk_accepts_ours_and_rotation_headers_verify() -> None:
    """paddle-python-sdk verifies our header; a header with two h1 (rotation) verifies too."""
    now = int(time.time())
    sent = ours("paddle", PADDLE_BODY, timestamp=now)["Paddle-Signature"]
    assert PaddleSignature().verify(sent, PADDLE_BODY.decode(), Secret(KEYS["paddle"].stored))
    old = ours("paddle", PADDLE_BODY, signing="pdl_old_secret", timestamp=now)["Paddle-Signature"]
    rotating = f"{old};h1={sent.split('h1=')[1]}"
    assert PaddleSignature().verify(rotating, PADDLE_BODY.decode(),
                                    Secret(KEYS["paddle"].stored))
    assert verifies("paddle", received({"Paddle-Signature": rotating}), PADDLE_BODY) == 0


def test_square_helper_accepts_ours() -> None:
    """squareup's webhooks helper verifies our signature over URL + body."""
    body = b'{"merchant_id":"M1","type":"payment.created","event_id":"e-1"}'
    sent = ours("square", body)
    assert square_verify(request_body=body.decode(),
                         signature_header=sent["x-square-hmacsha256-signature"],
                         signature_key=KEYS["square"].stored, notification_url=URL)
    assert verifies("square", received(sent), body) == 0
    moved = configured("square").configured(url=URL + "/moved")
    with pytest.raises(AuthenticationFailed):
        moved.verify(received(sent), body, [KEYS["square"].stored], now=0, tolerance=TOL)


def test_discord_interactions_accepts_ours_and_pynacl_signatures_verify() -> None:
    """discord-interactions' verify_key accepts our signature; PyNaCl's verifies in ours."""
    now = int(time.time())
    body = b'{"id":"1234","type":2,"data":{"name":"ping"}}'
    sent = ours("discord", body, timestamp=now)
    assert discord_interactions.verify_key(body, sent["X-Signature-Ed25519"],
                                           sent["X-Signature-Timestamp"], KEYS["discord"].stored)
    signature = SigningKey(bytes.fromhex(KEYS["discord"].signing)).sign(
        str(now).encode() + body).signature.hex()
    headers = received({"X-Signature-Ed25519": signature, "X-Signature-Timestamp": str(now)})
    assert verifies("discord", headers, body) == 0
    assert refusal("discord", headers, body.replace(b"ping", b"pong")) == "bad_signature"
