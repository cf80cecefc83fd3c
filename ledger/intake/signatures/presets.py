"""The preset sender profiles, as data. Each cites the sender's published scheme.

Adding a sender is a declaration here plus its vectors in tests/unit/. The
limits each scheme leaves (no timestamp, an unsigned id, rotation) are listed
in README.md, "Sender profiles".
"""

from __future__ import annotations

import time
from typing import Any

from ledger.intake.signatures import keys
from ledger.intake.signatures.fields import (
    BodyDigest,
    BodyPath,
    Dotted,
    Fixed,
    Header,
    Named,
    Wrapped,
)
from ledger.intake.signatures.profile import (
    FORM,
    JSON_ARRAY,
    RAW_SECRET,
    STRIPE_SECRET,
    HeaderSetId,
    SecretFormat,
    SenderProfile,
    hmac_hex,
    public_key_format,
)
from ledger.intake.signatures.schemes import (
    Entries,
    HeaderSet,
    SharedToken,
    SignedContent,
    Single,
    Template,
    form_content,
)

BODY = Template("{body}")
MIN_WHSEC_BYTES = 16
UNTYPED = "untyped"  # the type of a Standard Webhooks event whose body names none


def _whsec_or_whpk(secret: str) -> str | None:
    """Accept a `whsec_` HMAC key (16+ bytes) or a `whpk_` ed25519 public key."""
    if secret.startswith(keys.WHPK):
        return None if keys.whpk_key(secret) else "a whpk_ key is the base64 of 32 bytes"
    key = keys.whsec_key(secret)
    if key is None:
        return "a standard-webhooks secret looks like whsec_<base64> (or whpk_<base64>)"
    if len(key) < MIN_WHSEC_BYTES:
        return f"a standard-webhooks key must be at least {MIN_WHSEC_BYTES} bytes"
    return None


# Standard Webhooks (standardwebhooks.com; Svix, Resend, Clerk): `{id}.{ts}.{body}`,
# `v1` HMAC-SHA256 under the base64 key of a `whsec_` secret, `v1a` ed25519 under a
# `whpk_` public key. Svix sends the same headers under `svix-` unless told not to.
_STANDARD = SignedContent(
    headers=(HeaderSet(signature="webhook-signature", timestamp="webhook-timestamp",
                       id="webhook-id"),
             HeaderSet(signature="svix-signature", timestamp="svix-timestamp", id="svix-id")),
    format=Entries(separator=" ", pair=","),
    encoding="base64",
    algorithms={"v1": keys.HMAC_SHA256_WHSEC, "v1a": keys.ED25519_WHPK},
    content=Template("{id}.{timestamp}.{body}"),
)
STANDARD_WEBHOOKS = SenderProfile(
    name="standard-webhooks", scheme=_STANDARD, event_id=HeaderSetId(scheme=_STANDARD),
    event_type=BodyPath.of("type", default=UNTYPED), id_is_signed=True,
    secret=SecretFormat(
        generate=lambda: keys.WHSEC + keys.random_key_base64(24), check=_whsec_or_whpk,
        is_public=lambda secret: secret.startswith(keys.WHPK)),
)

# Stripe (docs.stripe.com/webhooks#verify-manually): `Stripe-Signature: t=…,v1=…`,
# HMAC-SHA256 hex of `{t}.{body}` under the whole `whsec_…` string as bytes.
STRIPE = SenderProfile(
    name="stripe",
    scheme=SignedContent(
        headers=(HeaderSet(signature="Stripe-Signature"),),
        format=Entries(separator=",", pair="=", timestamp="t"), encoding="hex",
        algorithms={"v1": keys.HMAC_SHA256}, content=Template("{timestamp}.{body}")),
    event_id=BodyPath.of("id"), event_type=BodyPath.of("type"), id_is_signed=True,
    secret=STRIPE_SECRET, example=lambda i, t, data: {"object": "event", "data": data},
)

# GitHub (docs.github.com "Validating webhook deliveries"): HMAC-SHA256 hex of the
# body; no timestamp; the delivery id and event name are unsigned headers.
GITHUB = SenderProfile(
    name="github",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Hub-Signature-256"),),
        format=Single(prefix="sha256=", version="sha256"), encoding="hex",
        algorithms={"sha256": keys.HMAC_SHA256}, content=BODY),
    event_id=Header("X-GitHub-Delivery"),
    event_type=Dotted(Header("X-GitHub-Event"), BodyPath.of("action")), id_is_signed=False,
)


def _slack_challenge(payload: Any, secret: str) -> dict[str, Any] | None:
    """Answer Slack's `url_verification` with its challenge."""
    if isinstance(payload, dict) and payload.get("type") == "url_verification":
        challenge = payload.get("challenge")
        if isinstance(challenge, str):
            return {"challenge": challenge}
    return None


# Slack (api.slack.com/authentication/verifying-requests-from-slack): `v0=` hex
# HMAC-SHA256 of `v0:{X-Slack-Request-Timestamp}:{body}` under the signing secret.
SLACK = SenderProfile(
    name="slack",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Slack-Signature", timestamp="X-Slack-Request-Timestamp"),),
        format=Single(prefix="v0=", version="v0"), encoding="hex",
        algorithms={"v0": keys.HMAC_SHA256}, content=Template("v0:{timestamp}:{body}")),
    event_id=BodyPath.of("event_id"),
    event_type=Wrapped("event_callback", BodyPath.of("type"), BodyPath.of("event.type")),
    id_is_signed=True, handshake=_slack_challenge,
    example=lambda i, t, data: {"team_id": "T0001", "api_app_id": "A0001", "data": data},
)

# Shopify (shopify.dev "Verify webhooks"): base64 HMAC-SHA256 of the body under the
# app's client secret; no timestamp; event id and topic are unsigned headers.
SHOPIFY = SenderProfile(
    name="shopify",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Shopify-Hmac-Sha256"),), format=Single(),
        encoding="base64", algorithms={"sig": keys.HMAC_SHA256}, content=BODY),
    event_id=Header("X-Shopify-Event-Id"), event_type=Header("X-Shopify-Topic", True),
    id_is_signed=False,
)

# GitLab (docs.gitlab.com "Webhooks"): the secret token repeated in X-Gitlab-Token;
# the body is not signed at all. `Idempotency-Key` stays the same across retries.
GITLAB = SenderProfile(
    name="gitlab", scheme=SharedToken(header="X-Gitlab-Token"),
    event_id=Header("Idempotency-Key"), event_type=BodyPath.of("object_kind"),
    id_is_signed=False,
)

# Linear (linear.app/developers/webhooks): hex HMAC-SHA256 of the body in
# Linear-Signature; the signed body's `webhookTimestamp` (ms) gives freshness.
LINEAR = SenderProfile(
    name="linear",
    scheme=SignedContent(
        headers=(HeaderSet(signature="Linear-Signature"),), format=Single(), encoding="hex",
        algorithms={"sig": keys.HMAC_SHA256}, content=BODY, body_timestamp="webhookTimestamp"),
    event_id=Header("Linear-Delivery"),
    event_type=Dotted(BodyPath.of("type"), BodyPath.of("action")), id_is_signed=False,
    example=lambda i, t, data: {"webhookTimestamp": int(time.time() * 1000), "data": data},
)

# Paddle Billing (developer.paddle.com "Verify webhook signatures"):
# `Paddle-Signature: ts=…;h1=…`, hex HMAC-SHA256 of `{ts}:{body}`; several `h1`
# while a secret rotates.
PADDLE = SenderProfile(
    name="paddle",
    scheme=SignedContent(
        headers=(HeaderSet(signature="Paddle-Signature"),),
        format=Entries(separator=";", pair="=", timestamp="ts"), encoding="hex",
        algorithms={"h1": keys.HMAC_SHA256}, content=Template("{timestamp}:{body}")),
    event_id=BodyPath.of("event_id"), event_type=BodyPath.of("event_type"),
    id_is_signed=True,
)

# PagerDuty v3 (developer.pagerduty.com "Verifying Signatures"):
# `X-PagerDuty-Signature: v1=<hex>[,v1=<hex>…]` over the body; no timestamp.
PAGERDUTY = SenderProfile(
    name="pagerduty",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-PagerDuty-Signature"),),
        format=Entries(separator=",", pair="=", trim=True), encoding="hex",
        algorithms={"v1": keys.HMAC_SHA256}, content=BODY),
    event_id=BodyPath.of("event.id"), event_type=BodyPath.of("event.event_type"),
    id_is_signed=True,
)


def _zoom_validation(payload: Any, secret: str) -> dict[str, Any] | None:
    """Answer Zoom's `endpoint.url_validation` with the token hashed under the secret."""
    if isinstance(payload, dict) and payload.get("event") == "endpoint.url_validation":
        inner = payload.get("payload")
        token = inner.get("plainToken") if isinstance(inner, dict) else None
        if isinstance(token, str) and token:
            return {"plainToken": token, "encryptedToken": hmac_hex(secret, token)}
    return None


# Zoom (developers.zoom.us "Using webhooks"): `x-zm-signature: v0=<hex>` HMAC-SHA256
# of `v0:{x-zm-request-timestamp}:{body}` under the Secret Token. Zoom sends no
# event id: the id is made from the signed body, so a retry is a duplicate.
ZOOM = SenderProfile(
    name="zoom",
    scheme=SignedContent(
        headers=(HeaderSet(signature="x-zm-signature", timestamp="x-zm-request-timestamp"),),
        format=Single(prefix="v0=", version="v0"), encoding="hex",
        algorithms={"v0": keys.HMAC_SHA256}, content=Template("v0:{timestamp}:{body}")),
    event_id=BodyDigest("zm_"), event_type=BodyPath.of("event"), id_is_signed=True,
    handshake=_zoom_validation,
    example=lambda i, t, data: {"event_ts": int(time.time() * 1000), "payload": data,
                                "data": data},
)

DISCORD_TYPES = {1: "ping", 2: "application_command", 3: "message_component",
                 4: "application_command_autocomplete", 5: "modal_submit"}


def _discord_ping(payload: Any, secret: str) -> dict[str, Any] | None:
    """Answer Discord's PING interaction with a PONG."""
    if isinstance(payload, dict) and payload.get("type") == 1:
        return {"type": 1}
    return None


# Discord interactions (discord.com/developers/docs/interactions): hex ed25519 of
# `{X-Signature-Timestamp}{body}` under the application's public key (hex).
DISCORD = SenderProfile(
    name="discord",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Signature-Ed25519", timestamp="X-Signature-Timestamp"),),
        format=Single(version="ed25519"), encoding="hex",
        algorithms={"ed25519": keys.ED25519_HEX}, content=Template("{timestamp}{body}")),
    event_id=BodyPath.of("id"), event_type=Named(BodyPath.of("type"), DISCORD_TYPES),
    id_is_signed=True, secret=public_key_format(keys.hex_ed25519_key, "hex ed25519 public key"),
    handshake=_discord_ping,
    example=lambda i, t, data: {"application_id": "1", "token": "t", "data": data},
)

# SendGrid Event Webhook (docs.sendgrid.com "Getting started with the Event Webhook
# Security Features"): base64 DER ECDSA P-256/SHA-256 of `{timestamp}{body}`; the
# body is a JSON array of events, each its own receipt.
SENDGRID = SenderProfile(
    name="sendgrid",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Twilio-Email-Event-Webhook-Signature",
                           timestamp="X-Twilio-Email-Event-Webhook-Timestamp"),),
        format=Single(version="ecdsa"), encoding="base64",
        algorithms={"ecdsa": keys.ECDSA_P256}, content=Template("{timestamp}{body}")),
    event_id=BodyPath.of("sg_event_id"), event_type=BodyPath.of("event"), id_is_signed=True,
    secret=public_key_format(keys.der_p256_key, "base64 DER P-256 public key"),
    body_format=JSON_ARRAY,
    example=lambda i, t, data: {"email": "user@example.com", "timestamp": int(time.time()),
                                "data": data},
)

# Twilio (twilio.com/docs/usage/security): base64 HMAC-SHA1 of the endpoint URL and
# the sorted form parameters under the auth token; no timestamp; the id is the
# unsigned I-Twilio-Idempotency-Token header. Needs the URL configured in Twilio.
TWILIO = SenderProfile(
    name="twilio",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Twilio-Signature"),), format=Single(),
        encoding="base64", algorithms={"sig": keys.HMAC_SHA1}, content=form_content,
        needs_url=True),
    event_id=Header("I-Twilio-Idempotency-Token"), event_type=Fixed("twilio.request"),
    id_is_signed=False, body_format=FORM,
    example=lambda i, t, data: {"AccountSid": "AC0001", **{k: str(v) for k, v in data.items()}},
)

# Square (developer.squareup.com "Validate notifications"): base64 HMAC-SHA256 of
# the notification URL followed by the body; no timestamp in the signature.
SQUARE = SenderProfile(
    name="square",
    scheme=SignedContent(
        headers=(HeaderSet(signature="x-square-hmacsha256-signature"),), format=Single(),
        encoding="base64", algorithms={"sig": keys.HMAC_SHA256}, content=Template("{url}{body}"),
        needs_url=True),
    event_id=BodyPath.of("event_id"), event_type=BodyPath.of("type"), id_is_signed=True,
    example=lambda i, t, data: {"merchant_id": "M0001", "data": data},
)

PRESETS = (STANDARD_WEBHOOKS, STRIPE, GITHUB, SLACK, SHOPIFY, GITLAB, LINEAR, PADDLE,
           PAGERDUTY, ZOOM, DISCORD, SENDGRID, TWILIO, SQUARE)
__all__ = ["PRESETS", "RAW_SECRET"]
