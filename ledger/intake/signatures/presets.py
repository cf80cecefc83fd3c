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
    BodyDigestId,
    BodyPath,
    ByShape,
    Dotted,
    First,
    Fixed,
    Header,
    Matching,
    Named,
    Wrapped,
)
from ledger.intake.signatures.profile import (
    FORM,
    JSON,
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
    SignedContent,
    Single,
    Template,
    form_content,
    twilio_json_content,
)
from ledger.intake.signatures.shared_token import SharedToken

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

# What an id-less delivery a sender documents gets: `sha256:<32 hex of the body digest>`.
DIGEST_ID = BodyDigestId()

# GitHub (docs.github.com "Validating webhook deliveries"): HMAC-SHA256 hex of the
# body; no timestamp; the delivery id and event name are unsigned headers. A hook
# whose content type is `form` (the REST API's default) posts `payload=<JSON>`: the
# raw bytes are signed, the decoded `payload` is stored. GitHub caps payloads at 25 MB.
GITHUB_MAX_BODY_BYTES = 25 * 1024 * 1024
GITHUB = SenderProfile(
    name="github",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Hub-Signature-256"),),
        format=Single(prefix="sha256=", version="sha256"), encoding="hex",
        algorithms={"sha256": keys.HMAC_SHA256}, content=BODY),
    event_id=Header("X-GitHub-Delivery"),
    event_type=Dotted(Header("X-GitHub-Event"),
                      First((BodyPath.of("action"), BodyPath.of("payload.action")))),
    id_is_signed=False, alternate_format=FORM, form_json_field="payload",
    max_body_bytes=GITHUB_MAX_BODY_BYTES,
)


def _slack_challenge(payload: Any, secret: str) -> tuple[int, dict[str, Any]] | None:
    """Answer Slack's `url_verification` with its challenge, and its slash-command ssl_check."""
    if not isinstance(payload, dict):
        return None
    if payload.get("type") == "url_verification":
        challenge = payload.get("challenge")
        if isinstance(challenge, str):
            return 200, {"challenge": challenge}
    if payload.get("ssl_check") == "1" and "command" not in payload:
        return 200, {}  # Slack only probes the certificate; it carries no command
    return None


# Slack (api.slack.com/authentication/verifying-requests-from-slack): `v0=` hex
# HMAC-SHA256 of `v0:{X-Slack-Request-Timestamp}:{body}` under the signing secret,
# for Events API JSON and for the forms of slash commands and interactivity alike.
# Those carry no event_id: a slash command is identified by its `trigger_id`, an
# interaction (`payload=<JSON>`) by the payload's `trigger_id`, or, for the kinds
# that have none (view_closed, for one), by a digest of the signed body.
SLASH_COMMAND = "slash_command"
SLACK_COMMAND = BodyPath.of("command")  # a slash command's form
SLACK_PAYLOAD = BodyPath.of("payload")  # an interaction's form, its JSON decoded
SLACK = SenderProfile(
    name="slack",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Slack-Signature", timestamp="X-Slack-Request-Timestamp"),),
        format=Single(prefix="v0=", version="v0"), encoding="hex",
        algorithms={"v0": keys.HMAC_SHA256}, content=Template("v0:{timestamp}:{body}")),
    event_id=ByShape(((SLACK_COMMAND, BodyPath.of("trigger_id")),
                      (SLACK_PAYLOAD, First((BodyPath.of("payload.trigger_id"),
                                             BodyDigest("sl_"))))),
                     otherwise=Matching(BodyPath.of("type"), "app_rate_limited", DIGEST_ID,
                                        BodyPath.of("event_id"))),
    event_type=ByShape(((SLACK_COMMAND, Fixed(SLASH_COMMAND)),
                        (SLACK_PAYLOAD, BodyPath.of("payload.type"))),
                       otherwise=Wrapped("event_callback", BodyPath.of("type"),
                                         BodyPath.of("event.type"))),
    id_is_signed=True, handshake=_slack_challenge, alternate_format=FORM,
    form_json_field="payload",
    example=lambda i, t, data: {"team_id": "T0001", "api_app_id": "A0001", "data": data},
)

# Shopify (shopify.dev "Verify webhooks"): base64 HMAC-SHA256 of the body under the
# app's client secret; no timestamp; event id and topic are unsigned headers, sent
# as `X-Shopify-*` or unprefixed (`shopify-*`). Without an event id the webhook id
# stands in, as in Shopify's own library.
SHOPIFY = SenderProfile(
    name="shopify",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Shopify-Hmac-Sha256"),
                 HeaderSet(signature="shopify-hmac-sha256")), format=Single(),
        encoding="base64", algorithms={"sig": keys.HMAC_SHA256}, content=BODY),
    event_id=First((Header("X-Shopify-Event-Id"), Header("shopify-event-id"),
                    Header("X-Shopify-Webhook-Id"), Header("shopify-webhook-id"))),
    event_type=First((Header("X-Shopify-Topic", True), Header("shopify-topic", True))),
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


def _zoom_validation(payload: Any, secret: str) -> tuple[int, dict[str, Any]] | None:
    """Answer Zoom's `endpoint.url_validation` with the token hashed under the secret."""
    if isinstance(payload, dict) and payload.get("event") == "endpoint.url_validation":
        inner = payload.get("payload")
        token = inner.get("plainToken") if isinstance(inner, dict) else None
        if isinstance(token, str) and token:
            return 200, {"plainToken": token, "encryptedToken": hmac_hex(secret, token)}
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
DISCORD_EVENT = BodyPath.of("event")  # only Webhook Events have one


def _discord_ping(payload: Any, secret: str) -> tuple[int, dict[str, Any]] | None:
    """Answer an interaction PING with a PONG, a Webhook Events PING with 204 and no body."""
    if not isinstance(payload, dict) or payload.get("event") is not None:
        return None
    kind = payload.get("type")
    if kind == 1 and not isinstance(kind, bool):
        return 200, {"type": 1}
    if kind == 0 and not isinstance(kind, bool):
        return 204, {}
    return None


# Discord (discord.com/developers/docs/interactions/overview, .../events/webhook-events):
# hex ed25519 of `{X-Signature-Timestamp}{body}` under the application's public key
# (hex), for interactions and Webhook Events alike. An interaction has an `id`
# snowflake; a Webhook Event (`{"version", "application_id", "type": 1, "event":
# {"type", "timestamp", "data"}}`) has none, so its id is made from the signed body.
DISCORD = SenderProfile(
    name="discord",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Signature-Ed25519", timestamp="X-Signature-Timestamp"),),
        format=Single(version="ed25519"), encoding="hex",
        algorithms={"ed25519": keys.ED25519_HEX}, content=Template("{timestamp}{body}")),
    event_id=ByShape(((DISCORD_EVENT, BodyDigest("dc_")),), otherwise=BodyPath.of("id")),
    event_type=ByShape(((DISCORD_EVENT, BodyPath.of("event.type")),),
                       otherwise=Named(BodyPath.of("type"), DISCORD_TYPES)),
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
# the sorted form parameters under the auth token; for a JSON body, of the URL with
# the body's `bodySHA256` appended. Shared keys (twilio.com/docs/usage/webhooks/
# webhook-shared-keys, Public Beta) sign the same content with the key's algorithm,
# named in X-Twilio-Webhooks-Signature-Settings. No timestamp; the id is the
# unsigned I-Twilio-Idempotency-Token header, or the body-digest id when Twilio sends
# none. Needs the URL configured in Twilio; it verifies with or without the default port.
TWILIO = SenderProfile(
    name="twilio",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Twilio-Signature"),), format=Single(version="HMAC_SHA1"),
        encoding="base64", algorithms={"HMAC_SHA1": keys.HMAC_SHA1,
                                       "HMAC_SHA256": keys.HMAC_SHA256},
        content=form_content, needs_url=True,
        algorithm_header="X-Twilio-Webhooks-Signature-Settings",
        json_content=twilio_json_content, port_variants=True),
    event_id=First((Header("I-Twilio-Idempotency-Token"), DIGEST_ID)),
    event_type=Fixed("twilio.request"),
    id_is_signed=False, body_format=FORM, alternate_format=JSON, signs_decoded_form=True,
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
