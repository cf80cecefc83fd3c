"""Test credentials for every preset profile: what the ledger stores, what the sender signs with.

For HMAC and token profiles both are the shared secret. For public-key profiles
the ledger stores the public half and the sender signs with the private half.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ledger.intake.signatures import PROFILES, SenderProfile
from ledger.intake.signatures.sns import sns_pair

URL = "https://hooks.example.com/hooks/in_example"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """What the integration stores, and what the sender signs with."""

    stored: str
    signing: str


def _ed25519(seed: bytes) -> tuple[str, str]:
    """Return (seed, public key) of a fixed ed25519 key, base64."""
    public = ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(seed).decode(), base64.b64encode(public).decode()


def _p256(secret: int) -> KeyPair:
    """Return a fixed P-256 pair as SendGrid shows it: base64 DER public key."""
    private = ec.derive_private_key(secret, ec.SECP256R1())
    der_private = private.private_bytes(serialization.Encoding.DER,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    der_public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(base64.b64encode(der_public).decode(), base64.b64encode(der_private).decode())


def _hex_ed25519(seed: bytes) -> KeyPair:
    """Return a Discord-style pair: hex public key stored, hex seed signing."""
    _, public_b64 = _ed25519(seed)
    return KeyPair(base64.b64decode(public_b64).hex(), seed.hex())


def _whpk(seed: bytes) -> KeyPair:
    """Return a Standard Webhooks v1a pair: whpk_ stored, whsk_ signing."""
    seed_b64, public_b64 = _ed25519(seed)
    return KeyPair("whpk_" + public_b64, "whsk_" + seed_b64)


def _sns_certificate(name: str) -> KeyPair:
    """Return an SNS-like pair: a self-signed RSA certificate stored, its private key signing."""
    return KeyPair(*sns_pair(name))


def _shared(secret: str) -> KeyPair:
    return KeyPair(secret, secret)


KEYS: dict[str, KeyPair] = {
    "standard-webhooks": _shared("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    "stripe": _shared("whsec_test_secret_for_stripe"),
    "github": _shared("It's a Secret to Everybody"),
    "slack": _shared("8f742231b10e8888abcd99yyyzzz85a5"),
    "shopify": _shared("shpss_hush_hush_app_secret"),
    "gitlab": _shared("gitlab-secret-token"),
    "linear": _shared("lin_wh_signing_secret"),
    "paddle": _shared("pdl_ntfset_01gkpjp8bkm3tm53kdgkx6sms7_6h3qd3uFSi9YCD3OLYAShQI90XTI2vEI"),
    "pagerduty": _shared("pagerduty-v3-webhook-secret"),
    "zoom": _shared("zoom-secret-token"),
    "discord": _hex_ed25519(bytes(range(32))),
    "sendgrid": _p256(0x5EED),
    "twilio": _shared("12345"),
    "square": _shared("square-signature-key"),
    "calendly": _shared("calendly-webhook-signing-key"),
    "twitch": _shared("twitch-eventsub-secret-0123456789"),
    "zendesk": _shared("dGhpc19zZWNyZXRfaXNfZm9yX3Rlc3RpbmdfcHVycG9zZXNfb25seQ=="),
    "hubspot": _shared("hubspot-app-client-secret"),
    "intercom": _shared("intercom-client-secret"),
    "typeform": _shared("typeform-webhook-secret"),
    "mailgun": _shared("key-mailgun-webhook-signing-key"),
    "adyen": _shared("44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"),
    "aws-sns": _sns_certificate("sns.us-east-1.amazonaws.com"),
}
OTHER_KEYS: dict[str, KeyPair] = {
    "standard-webhooks": _shared("whsec_" + base64.b64encode(b"another key of 24 bytes!").decode()),
    "stripe": _shared("whsec_another_stripe_secret"),
    "github": _shared("another github secret"),
    "discord": _hex_ed25519(bytes(range(1, 33))),
    "sendgrid": _p256(0xC0FFEE),
    **{name: _shared(f"another {name} secret") for name in (
        "slack", "shopify", "gitlab", "linear", "paddle", "pagerduty", "zoom", "twilio",
        "square", "calendly", "twitch", "zendesk", "hubspot", "intercom", "typeform",
        "mailgun")},
    "adyen": _shared("A0" * 32),
    "aws-sns": _sns_certificate("another.sns.example"),
}
V1A = _whpk(bytes(range(100, 132)))
V1A_OTHER = _whpk(bytes(range(140, 172)))


def configured(name: str) -> SenderProfile:
    """Return preset `name` as an integration would hold it (URL-signing senders get URL)."""
    profile = PROFILES[name]
    return profile.configured(url=URL) if getattr(profile.scheme, "needs_url", False) else profile
