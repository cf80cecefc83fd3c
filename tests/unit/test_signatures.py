"""Sender signature profiles: interoperate with the senders' own code, refuse bad input."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks
import stripe
from hypothesis import given
from hypothesis import strategies as st

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import PROFILES, EventIdentity, HeaderMap, Verified, get_profile
from tests.profile_keys import KEYS, OTHER_KEYS, configured

NOW = 1_700_000_000
TOL = 300
BODY = b'{"id": "evt_1", "type": "demo.credit", "data": {"amount": 5}}'
SECRETS = {name: pair.stored for name, pair in KEYS.items()}
OTHER_SECRETS = {name: pair.stored for name, pair in OTHER_KEYS.items()}
# Linear's freshness is the signed body's `webhookTimestamp` (milliseconds).
BODIES = {"linear": b'{"type": "Issue", "action": "create", "webhookTimestamp": %d}' % (NOW * 1000)}
# Mailgun signs inside the body (a `seal`, not headers): tests/unit/test_mailgun.py.
HEADER_SIGNED = sorted(name for name, profile in PROFILES.items()
                       if not profile.signature_in_body)
GENERATED = sorted(name for name in HEADER_SIGNED if PROFILES[name].secret.generate)
SIGNATURE_HEADER = {
    "standard-webhooks": "webhook-signature",
    "stripe": "stripe-signature",
    "github": "x-hub-signature-256",
}
HEX64 = "ab" * 32
B64_32 = base64.b64encode(bytes(range(32))).decode()


def received(headers: dict[str, str]) -> dict[str, list[str]]:
    """Return `headers` as the intake passes them: lower-case names, lists of values."""
    return {name.lower(): [value] for name, value in headers.items()}


def signed(name: str, *, body: bytes | None = None, timestamp: int = NOW) -> dict[str, list[str]]:
    """Return received headers for `body` signed by profile `name` with its test secret."""
    body = BODIES.get(name, BODY) if body is None else body
    sent = configured(name).sign(
        KEYS[name].signing, body, event_id="evt_1", event_type="demo.credit", timestamp=timestamp
    )
    return received(sent)


def verify(name: str, headers: HeaderMap, secrets: list[str] | None = None) -> Verified:
    """Verify `BODY` under profile `name` at NOW with the default tolerance."""
    chosen = [SECRETS[name]] if secrets is None else secrets
    body = BODIES.get(name, BODY)
    return configured(name).verify(headers, body, chosen, now=NOW, tolerance=TOL)


def refused(name: str, headers: HeaderMap, secrets: list[str] | None = None) -> str:
    """Return the reason profile `name` gives for refusing `headers`."""
    with pytest.raises(AuthenticationFailed) as caught:
        verify(name, headers, secrets)
    # The message is the bare reason: no secret, signature or body leaks through it.
    assert str(caught.value) == caught.value.reason
    return caught.value.reason


# --- interoperability with the senders' own libraries -------------------------------


def test_standardwebhooks_library_signature_verifies() -> None:
    """A signature made by the standardwebhooks package verifies with our profile."""
    moment = datetime.fromtimestamp(NOW, tz=UTC)
    header = standardwebhooks.Webhook(SECRETS["standard-webhooks"]).sign(
        "msg_1", moment, BODY.decode()
    )
    headers = received(
        {"webhook-id": "msg_1", "webhook-timestamp": str(NOW), "webhook-signature": header}
    )
    assert verify("standard-webhooks", headers) == Verified(secret_index=0, timestamp=NOW)


def test_our_standard_webhooks_signature_passes_the_library() -> None:
    """Our sign() output passes standardwebhooks' own verify (which uses the wall clock)."""
    sent = PROFILES["standard-webhooks"].sign(
        SECRETS["standard-webhooks"],
        BODY,
        event_id="msg_1",
        event_type="x",
        timestamp=int(time.time()),
    )
    parsed = standardwebhooks.Webhook(SECRETS["standard-webhooks"]).verify(BODY, sent)
    assert parsed["id"] == "evt_1"


def test_standard_webhooks_library_test_vector() -> None:
    """The vector from the standardwebhooks test suite signs and verifies identically."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    profile = PROFILES["standard-webhooks"]
    sent = profile.sign(
        secret, body, event_id="msg_p5jXN8AQM9LWM0D4loKWxJek", event_type="x", timestamp=1614265330
    )
    assert sent["webhook-signature"] == expected
    found = profile.verify(received(sent), body, [secret], now=1614265330, tolerance=TOL)
    assert found.secret_index == 0


def test_our_stripe_signature_passes_the_stripe_library() -> None:
    """Our Stripe-Signature header passes stripe.WebhookSignature.verify_header."""
    secret = SECRETS["stripe"]
    sent = PROFILES["stripe"].sign(
        secret, BODY, event_id="", event_type="", timestamp=int(time.time())
    )
    assert stripe.WebhookSignature.verify_header(BODY, sent["Stripe-Signature"], secret, TOL)


def test_stripe_library_header_verifies() -> None:
    """A header from stripe's own test helper verifies with our profile."""
    header = stripe.WebhookSignature.generate_signature_header(
        BODY.decode(), SECRETS["stripe"], timestamp=NOW
    )
    assert verify("stripe", received({"Stripe-Signature": header})).timestamp == NOW


def test_github_documentation_vector() -> None:
    """GitHub's documented example signature is what we produce and accept."""
    secret, body = "It's a Secret to Everybody", b"Hello, World!"
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    profile = PROFILES["github"]
    sent = profile.sign(secret, body, event_id="d-1", event_type="ping", timestamp=0)
    assert sent["X-Hub-Signature-256"] == expected
    headers = received({"X-Hub-Signature-256": expected})
    assert profile.verify(headers, body, [secret], now=NOW, tolerance=TOL).secret_index == 0


def test_sign_uses_the_senders_header_names() -> None:
    """sign() returns exactly the headers, in canonical case, that each sender sends."""
    names = {
        name: set(configured(name).sign(KEYS[name].signing, BODY, event_id="e", event_type="a.b",
                                        timestamp=NOW))
        for name in HEADER_SIGNED
    }
    assert names == {
        "standard-webhooks": {"webhook-id", "webhook-timestamp", "webhook-signature"},
        "stripe": {"Stripe-Signature"},
        "github": {"X-Hub-Signature-256", "X-GitHub-Delivery", "X-GitHub-Event"},
        "slack": {"X-Slack-Signature", "X-Slack-Request-Timestamp"},
        "shopify": {"X-Shopify-Hmac-Sha256", "X-Shopify-Event-Id", "X-Shopify-Topic"},
        "gitlab": {"X-Gitlab-Token", "Idempotency-Key"},
        "linear": {"Linear-Signature", "Linear-Delivery"},
        "paddle": {"Paddle-Signature"},
        "pagerduty": {"X-PagerDuty-Signature"},
        "zoom": {"x-zm-signature", "x-zm-request-timestamp"},
        "discord": {"X-Signature-Ed25519", "X-Signature-Timestamp"},
        "sendgrid": {"X-Twilio-Email-Event-Webhook-Signature",
                     "X-Twilio-Email-Event-Webhook-Timestamp"},
        "twilio": {"X-Twilio-Signature", "I-Twilio-Idempotency-Token"},
        "square": {"x-square-hmacsha256-signature"},
        "calendly": {"Calendly-Webhook-Signature"},
        "twitch": {"Twitch-Eventsub-Message-Signature", "Twitch-Eventsub-Message-Timestamp",
                   "Twitch-Eventsub-Message-Id"},
        "zendesk": {"X-Zendesk-Webhook-Signature", "X-Zendesk-Webhook-Signature-Timestamp"},
        "hubspot": {"X-HubSpot-Signature-v3", "X-HubSpot-Request-Timestamp"},
        "intercom": {"X-Hub-Signature"},
        "typeform": {"Typeform-Signature"},
    }


# --- refusals ------------------------------------------------------------------------


def valid_core(name: str) -> str:
    """Return the bare signature (base64 or hex) profile `name` makes for `BODY` at NOW."""
    value = signed(name)[SIGNATURE_HEADER[name]][0]
    return value.split(",", 1)[1] if name == "standard-webhooks" else value.split("=")[-1]


def noncanonical_base64(sig: str) -> str:
    """Return `sig` with its unused trailing bits set: same bytes, different spelling."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(sig[-2])
    variant = sig[:-2] + alphabet[last ^ 1] + sig[-1]
    assert base64.b64decode(variant) == base64.b64decode(sig)
    return variant


Overrides = dict[str, list[str] | None]

STANDARD_CASES: list[tuple[Overrides, str]] = [
    ({"webhook-signature": None}, "missing_signature"),
    ({"webhook-signature": [""]}, "missing_signature"),
    ({"webhook-signature": ["v1,{sig}", "v1,{sig}"]}, "duplicate_header"),
    ({"webhook-signature": ["v1,{sig}\u00e9"]}, "malformed_header"),
    ({"webhook-signature": ["v1,!!!not-base64!!!"]}, "malformed_signature"),
    ({"webhook-signature": ["v1," + base64.b64encode(bytes(16)).decode()]}, "malformed_signature"),
    ({"webhook-signature": ["v1," + HEX64]}, "malformed_signature"),
    ({"webhook-signature": ["v1,{unpadded}"]}, "malformed_signature"),
    ({"webhook-signature": ["v1,{noncanonical}"]}, "malformed_signature"),
    # Entries that do not parse are skipped, so nothing supported remains.
    ({"webhook-signature": ["v1"]}, "no_supported_signature"),
    ({"webhook-signature": ["v1,"]}, "no_supported_signature"),
    ({"webhook-signature": ["v1,a,b"]}, "malformed_signature"),
    ({"webhook-signature": ["garbage"]}, "no_supported_signature"),
    ({"webhook-signature": [",{sig}"]}, "no_supported_signature"),
    ({"webhook-signature": ["v2,{sig}"]}, "no_supported_signature"),
    ({"webhook-signature": ["v1a,{sig}"]}, "malformed_signature"),
    ({"webhook-signature": ["v1a," + base64.b64encode(bytes(64)).decode()]}, "bad_signature"),
    ({"webhook-signature": ["V1,{sig}"]}, "no_supported_signature"),
    ({"webhook-signature": ["v1," + B64_32]}, "bad_signature"),
    ({"webhook-id": None}, "missing_id"),
    ({"webhook-id": [""]}, "missing_id"),
    ({"webhook-id": ["evt_1", "evt_1"]}, "duplicate_header"),
    ({"webhook-id": ["evt_\u00e9"]}, "malformed_header"),
    ({"webhook-id": ["evt\x001"]}, "malformed_header"),
    ({"webhook-id": ["evt_2"]}, "bad_signature"),
    ({"webhook-timestamp": None}, "missing_timestamp"),
    ({"webhook-timestamp": [""]}, "missing_timestamp"),
    ({"webhook-timestamp": [str(NOW), str(NOW)]}, "duplicate_header"),
    ({"webhook-timestamp": ["\uff11\uff17\uff10\uff10"]}, "malformed_header"),
    ({"webhook-timestamp": ["hello"]}, "malformed_timestamp"),
    ({"webhook-timestamp": ["1e10"]}, "malformed_timestamp"),
    ({"webhook-timestamp": ["NaN"]}, "malformed_timestamp"),
    ({"webhook-timestamp": [f"-{NOW}"]}, "malformed_timestamp"),
    ({"webhook-timestamp": [f"{NOW}.5"]}, "malformed_timestamp"),
    ({"webhook-timestamp": [f"+{NOW}"]}, "malformed_timestamp"),
    ({"webhook-timestamp": [f" {NOW}"]}, "malformed_timestamp"),
    ({"webhook-timestamp": [f"{NOW} "]}, "malformed_timestamp"),
    ({"webhook-timestamp": [f"0{NOW}"]}, "malformed_timestamp"),
    ({"webhook-timestamp": ["0x6553f100"]}, "malformed_timestamp"),
    ({"webhook-timestamp": ["1_700_000_000"]}, "malformed_timestamp"),
    ({"webhook-timestamp": ["9" * 5000]}, "malformed_timestamp"),
]

STRIPE_CASES: list[tuple[Overrides, str]] = [
    ({"stripe-signature": None}, "missing_signature"),
    ({"stripe-signature": [""]}, "missing_signature"),
    ({"stripe-signature": [f"t={NOW},v1={{sig}}"] * 2}, "duplicate_header"),
    ({"stripe-signature": [f"t={NOW},v1={{sig}}\u00e9"]}, "malformed_header"),
    ({"stripe-signature": ["v1={sig}"]}, "missing_timestamp"),
    ({"stripe-signature": ["t=,v1={sig}"]}, "missing_timestamp"),
    ({"stripe-signature": ["t=hello,v1={sig}"]}, "malformed_timestamp"),
    ({"stripe-signature": ["t=1e10,v1={sig}"]}, "malformed_timestamp"),
    ({"stripe-signature": ["t=NaN,v1={sig}"]}, "malformed_timestamp"),
    ({"stripe-signature": [f"t=-{NOW},v1={{sig}}"]}, "malformed_timestamp"),
    ({"stripe-signature": [f"t={NOW}.5,v1={{sig}}"]}, "malformed_timestamp"),
    ({"stripe-signature": [f"t=+{NOW},v1={{sig}}"]}, "malformed_timestamp"),
    ({"stripe-signature": [f"t= {NOW},v1={{sig}}"]}, "malformed_timestamp"),
    ({"stripe-signature": ["t=" + "9" * 5000 + ",v1={sig}"]}, "malformed_timestamp"),
    ({"stripe-signature": [f"t={NOW},t={NOW},v1={{sig}}"]}, "malformed_signature"),
    ({"stripe-signature": [f"t={NOW},v1={{SIG}}"]}, "malformed_signature"),
    ({"stripe-signature": [f"t={NOW},v1={{sig}}00"]}, "malformed_signature"),
    ({"stripe-signature": [f"t={NOW},v1=" + "zz" * 32]}, "malformed_signature"),
    ({"stripe-signature": [f"t={NOW},v1=" + HEX64[:-1]]}, "malformed_signature"),
    ({"stripe-signature": [f"t={NOW},v1="]}, "no_supported_signature"),
    ({"stripe-signature": [f"t={NOW},v1"]}, "no_supported_signature"),
    ({"stripe-signature": [f"t={NOW},v1=nothex,v1=potato"]}, "malformed_signature"),
    ({"stripe-signature": [f"t={NOW},v0={{sig}}"]}, "no_supported_signature"),
    ({"stripe-signature": [f"t={NOW}"]}, "no_supported_signature"),
    ({"stripe-signature": [f"t={NOW},v1=" + HEX64]}, "bad_signature"),
]

GITHUB_CASES: list[tuple[Overrides, str]] = [
    ({"x-hub-signature-256": None}, "missing_signature"),
    ({"x-hub-signature-256": None, "x-hub-signature": ["sha1=" + "ab" * 20]}, "missing_signature"),
    ({"x-hub-signature-256": [""]}, "missing_signature"),
    ({"x-hub-signature-256": ["sha256={sig}"] * 2}, "duplicate_header"),
    ({"x-hub-signature-256": ["sha256={sig}\u00e9"]}, "malformed_header"),
    ({"x-hub-signature-256": ["sha256={SIG}"]}, "malformed_signature"),
    ({"x-hub-signature-256": ["sha256={sig}="]}, "malformed_signature"),
    ({"x-hub-signature-256": ["sha256=" + "zz" * 32]}, "malformed_signature"),
    ({"x-hub-signature-256": ["sha256="]}, "malformed_signature"),
    ({"x-hub-signature-256": ["sha256"]}, "no_supported_signature"),
    ({"x-hub-signature-256": ["{sig}"]}, "no_supported_signature"),
    ({"x-hub-signature-256": ["sha1=" + "ab" * 20]}, "no_supported_signature"),
    ({"x-hub-signature-256": ["SHA256={sig}"]}, "no_supported_signature"),
    ({"x-hub-signature-256": ["sha256=" + HEX64]}, "bad_signature"),
]

REFUSALS = [
    pytest.param(name, overrides, reason, id=f"{name}-{reason}-{index}")
    for name, cases in (
        ("standard-webhooks", STANDARD_CASES),
        ("stripe", STRIPE_CASES),
        ("github", GITHUB_CASES),
    )
    for index, (overrides, reason) in enumerate(cases)
]


def with_overrides(name: str, overrides: Overrides) -> dict[str, list[str]]:
    """Return profile `name`'s valid headers with `overrides` applied ({sig} filled in)."""
    sig = valid_core(name) if name in SIGNATURE_HEADER else ""
    fill = {"sig": sig, "SIG": sig.upper(), "unpadded": sig.rstrip("=")}
    if name == "standard-webhooks":
        fill["noncanonical"] = noncanonical_base64(sig)
    headers = signed(name)
    for header, values in overrides.items():
        if values is None:
            headers.pop(header, None)
        else:
            headers[header] = [value.format(**fill) for value in values]
    return headers


@pytest.mark.parametrize(("name", "overrides", "reason"), REFUSALS)
def test_bad_input_is_refused(name: str, overrides: Overrides, reason: str) -> None:
    """Each malformed, missing, repeated or wrong header fails with its own reason."""
    assert refused(name, with_overrides(name, overrides)) == reason


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_unaltered_headers_verify(name: str) -> None:
    """The baseline the refusal cases start from does verify (so they can fail)."""
    assert verify(name, with_overrides(name, {})).secret_index == 0


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("standard-webhooks", "v2,{sig} v1," + B64_32 + " v1,{sig}"),
        ("standard-webhooks", "v1,{sig} v1," + B64_32),
        ("stripe", f"t={NOW},v0=junk,v1=" + HEX64 + ",v1={sig}"),
        ("stripe", f"t={NOW},v1={{sig}},v1=" + HEX64),
        # Malformed entries are skipped, never fatal (CONTRACT section 2).
        ("standard-webhooks", "v1,{sig}  v1,{sig}"),
        ("standard-webhooks", "v1,!!! v1,{sig}"),
        ("standard-webhooks", "garbage v1,{sig}"),
        ("standard-webhooks", "v1a,!!! v1,{sig}"),
        ("stripe", f"t={NOW},v1={{sig}},"),
        ("stripe", f"t={NOW},v1={{sig}},v1=potato"),
        ("stripe", f"t={NOW},v1=potato,v1={{sig}}"),
        ("stripe", f"t={NOW},v1,v1={{sig}}"),
    ],
)
def test_any_matching_candidate_passes(name: str, header: str) -> None:
    """Unknown schemes and malformed entries are skipped; one matching signature suffices."""
    headers = with_overrides(name, {SIGNATURE_HEADER[name]: [header]})
    assert verify(name, headers).secret_index == 0


@pytest.mark.parametrize("name", ["standard-webhooks", "stripe"])
@pytest.mark.parametrize(
    ("offset", "reason"),
    [
        (-TOL, None),
        (TOL, None),
        (0, None),
        (-TOL - 1, "stale_timestamp"),
        (TOL + 1, "future_timestamp"),
    ],
)
def test_freshness_window_is_inclusive(name: str, offset: int, reason: str | None) -> None:
    """A timestamp exactly `tolerance` away passes; one second further fails."""
    headers = signed(name, timestamp=NOW + offset)
    if reason is None:
        assert verify(name, headers).timestamp == NOW + offset
    else:
        assert refused(name, headers) == reason


@pytest.mark.parametrize("name", ["standard-webhooks", "stripe"])
@pytest.mark.parametrize(
    ("timestamp", "reason"), [(NOW * 1000, "future_timestamp"), (1, "stale_timestamp")]
)
def test_out_of_window_timestamps_fail(name: str, timestamp: int, reason: str) -> None:
    """A correctly signed milliseconds or ancient timestamp is still refused."""
    assert refused(name, signed(name, timestamp=timestamp)) == reason


def test_github_has_no_freshness_check() -> None:
    """GitHub sends no timestamp: an old delivery verifies (documented limit)."""
    profile = PROFILES["github"]
    assert (profile.has_timestamp, profile.id_is_signed) == (False, False)
    found = profile.verify(signed("github"), BODY, [SECRETS["github"]], now=NOW * 10, tolerance=0)
    assert found == Verified(secret_index=0, timestamp=None)


# --- secrets and rotation ------------------------------------------------------------


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_rotation_reports_which_secret_matched(name: str) -> None:
    """With two live secrets, a delivery signed by the second says secret_index 1."""
    assert verify(name, signed(name), [OTHER_SECRETS[name], SECRETS[name]]).secret_index == 1
    assert verify(name, signed(name), [SECRETS[name], OTHER_SECRETS[name]]).secret_index == 0


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_valid_signature_under_another_secret_fails(name: str) -> None:
    """A well-formed signature made with a secret that is not live is refused."""
    assert refused(name, signed(name), [OTHER_SECRETS[name]]) == "bad_signature"


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_no_live_secret_fails(name: str) -> None:
    """An integration with no live secret refuses everything, even without headers."""
    assert refused(name, signed(name), []) == "no_secret"
    assert refused(name, {}, []) == "no_secret"


BROKEN_WHSEC = [
    SECRETS["standard-webhooks"].removeprefix("whsec_"),
    "not-a-whsec-secret",
    "whsec_",
    "whsec_!!!!",
    "whsec_A",
    "whsec_A====",
    "",
]


@pytest.mark.parametrize("broken", BROKEN_WHSEC)
def test_broken_standard_webhooks_secret_never_matches(broken: str) -> None:
    """A stored secret that is not whsec_<base64> matches nothing and does not crash."""
    good = SECRETS["standard-webhooks"]
    assert refused("standard-webhooks", signed("standard-webhooks"), [broken]) == "bad_signature"
    assert (
        verify("standard-webhooks", signed("standard-webhooks"), [broken, good]).secret_index == 1
    )


@pytest.mark.parametrize(
    ("name", "header", "message"),
    [
        ("stripe", f"t={NOW},v1={{sig}}", f"{NOW}.".encode() + BODY),
        ("github", "sha256={sig}", BODY),
    ],
)
def test_empty_raw_secret_never_matches(name: str, header: str, message: bytes) -> None:
    """An empty stored secret is no key, even against a body signed with an empty key."""
    empty_key_sig = hmac.new(b"", message, hashlib.sha256).hexdigest()
    headers = received({SIGNATURE_HEADER[name]: header.format(sig=empty_key_sig)})
    assert refused(name, headers, [""]) == "bad_signature"


def test_unpadded_whsec_key_is_accepted() -> None:
    """Senders publish keys without '=' padding; the key is the same either way."""
    padded = "whsec_" + base64.b64encode(b"twenty-three byte key!!").decode()
    assert padded.endswith("=")
    profile = PROFILES["standard-webhooks"]
    sent = profile.sign(padded, BODY, event_id="e", event_type="t", timestamp=NOW)
    found = profile.verify(received(sent), BODY, [padded.rstrip("=")], now=NOW, tolerance=TOL)
    assert found.secret_index == 0


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_headers_must_be_lists(name: str) -> None:
    """A bare string where the intake owes a list of values is a caller bug, not a pass."""
    # A str is itself a Sequence[str], so type checkers let this through: check at runtime.
    headers = {key: values[0] for key, values in signed(name).items()}
    with pytest.raises(TypeError):
        verify(name, headers)


@pytest.mark.parametrize("name", GENERATED)
def test_generated_secret_signs_and_verifies(name: str) -> None:
    """A fresh secret is in the sender's format, unique, and usable at once."""
    profile = configured(name)
    secret = profile.generate_secret()
    assert secret != profile.generate_secret()
    assert len(secret) >= 32 and secret.isascii() and secret.isprintable()
    assert profile.secret.check(secret) is None
    if name in ("standard-webhooks", "stripe"):
        assert secret.startswith("whsec_")
    body = BODIES.get(name, BODY)
    sent = profile.sign(secret, body, event_id="evt_1", event_type="demo.credit", timestamp=NOW)
    assert profile.verify(received(sent), body, [secret], now=NOW, tolerance=TOL).secret_index == 0


def test_generated_standard_webhooks_secret_holds_a_base64_key() -> None:
    """The whsec_ secret's key part is the base64 of 24 random bytes."""
    secret = PROFILES["standard-webhooks"].generate_secret()
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 24


# --- profile lookup ------------------------------------------------------------------


def test_profiles_are_registered_by_name() -> None:
    """Each profile is found under its contract name."""
    assert sorted(PROFILES) == sorted(KEYS)
    assert {"slack", "shopify", "gitlab", "linear", "paddle", "pagerduty", "zoom", "discord",
            "twilio", "sendgrid"} <= set(PROFILES)
    for name, profile in PROFILES.items():
        assert get_profile(name) is profile and profile.name == name


# `hmac` is no preset: it exists only with an integration's options (profile_for).
@pytest.mark.parametrize("name", [None, "", "Stripe", "stripe ", "hmac", "standard_webhooks"])
def test_unknown_profile_fails_closed(name: str | None) -> None:
    """A missing or unknown profile name refuses authentication."""
    with pytest.raises(AuthenticationFailed) as caught:
        get_profile(name)
    assert caught.value.reason == "unknown_profile"


# --- event identity ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "headers", "payload", "expected"),
    [
        ("standard-webhooks", {"webhook-id": ["msg_1"]}, {"type": "a.b"}, ("msg_1", "a.b")),
        ("standard-webhooks", {}, {}, (None, "untyped")),
        ("standard-webhooks", {"svix-id": ["msg_2"], "svix-signature": ["v1,x"]}, {"type": "a"},
         ("msg_2", "a")),
        ("standard-webhooks", {"webhook-id": ["a", "b"]}, {"type": 5}, (["a", "b"], 5)),
        ("standard-webhooks", {"webhook-id": ["msg_1"]}, ["not", "a", "dict"],
         ("msg_1", "untyped")),
        ("stripe", {}, {"id": "evt_1", "type": "charge.succeeded"}, ("evt_1", "charge.succeeded")),
        ("stripe", {}, {"id": 7, "type": None}, (7, None)),
        ("stripe", {}, "a string body", (None, None)),
        (
            "github",
            {"x-github-delivery": ["d-1"], "x-github-event": ["issues"]},
            {"action": "opened"},
            ("d-1", "issues.opened"),
        ),
        ("github", {"x-github-delivery": ["d-1"], "x-github-event": ["push"]}, {}, ("d-1", "push")),
        (
            "github",
            {"x-github-delivery": ["d-1"], "x-github-event": ["push"]},
            {"action": ["odd"]},
            ("d-1", "push"),
        ),
        ("github", {"x-github-event": ["push"]}, {"action": ""}, (None, "push")),
        ("github", {}, {"action": "opened"}, (None, None)),
        ("github", {"x-github-delivery": ["d-1", "d-2"]}, None, (["d-1", "d-2"], None)),
    ],
)
def test_identity_returns_what_the_sender_sent(
    name: str, headers: dict[str, list[str]], payload: object, expected: tuple[object, object]
) -> None:
    """identity() never raises on odd input; it hands back what is there to validate."""
    found = PROFILES[name].identity(headers, payload)  # type: ignore[arg-type]
    assert found == EventIdentity(event_id=expected[0], event_type=expected[1])


def test_github_sign_splits_the_event_type() -> None:
    """GitHub's event header carries the part before the first dot of the type."""
    sent = PROFILES["github"].sign(
        "s", BODY, event_id="d-9", event_type="pull_request.closed.x", timestamp=NOW
    )
    assert (sent["X-GitHub-Delivery"], sent["X-GitHub-Event"]) == ("d-9", "pull_request")


# --- properties ----------------------------------------------------------------------

SECRET_STRATEGIES = {
    "standard-webhooks": st.binary(min_size=1, max_size=64).map(
        lambda key: "whsec_" + base64.b64encode(key).decode()
    ),
    # Twilio signs the parsed form parameters, not the raw bytes: a flipped byte
    # may leave them unchanged, so it has its own tests (test_sender_libraries).
    **{name: st.text(min_size=1, max_size=64) for name in (
        "stripe", "github", "slack", "shopify", "paddle", "pagerduty", "zoom", "square",
        "calendly", "twitch", "zendesk", "intercom", "typeform")},
}
EVENT_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,40}", fullmatch=True)


@pytest.mark.parametrize("name", sorted(SECRET_STRATEGIES))
@given(data=st.data(), body=st.binary(min_size=1, max_size=512), event_id=EVENT_IDS)
def test_sign_then_verify_round_trips_and_any_flip_fails(
    name: str, data: st.DataObject, body: bytes, event_id: str
) -> None:
    """Whatever the body, secret and time, our signature verifies; a flipped byte does not."""
    profile = configured(name)
    secret = data.draw(SECRET_STRATEGIES[name])
    timestamp = data.draw(st.integers(min_value=1, max_value=10**11))
    now = timestamp + data.draw(st.integers(min_value=-TOL, max_value=TOL))
    headers = received(
        profile.sign(secret, body, event_id=event_id, event_type="t.a", timestamp=timestamp)
    )
    assert profile.verify(headers, body, [secret], now=now, tolerance=TOL).secret_index == 0
    index = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    flipped = bytearray(body)
    flipped[index] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(AuthenticationFailed) as caught:
        profile.verify(headers, bytes(flipped), [secret], now=now, tolerance=TOL)
    assert caught.value.reason == "bad_signature"


HEADER_TEXT = st.one_of(
    st.text(max_size=120),
    st.text(alphabet="v1t=,. +/-0123456789abcdefsha", max_size=120),
)


@pytest.mark.parametrize("name", HEADER_SIGNED)
@given(data=st.data(), values=st.lists(HEADER_TEXT, max_size=3))
def test_arbitrary_header_text_is_refused_cleanly(
    name: str, data: st.DataObject, values: list[str]
) -> None:
    """Any text in any header a profile reads fails authentication; nothing else escapes."""
    headers = signed(name)
    headers[data.draw(st.sampled_from(sorted(headers)))] = values
    try:
        verify(name, headers)
    except AuthenticationFailed as failure:
        assert str(failure) == failure.reason
