"""Third-edition presets (CONTRACT section 2): senders a platform connects besides the first
fourteen. Each cites the sender's published scheme; docs/senders/<name>.md says what it
covers and what it leaves.
"""

from __future__ import annotations

import json
import secrets as random
import time
from dataclasses import dataclass
from typing import Any

from ledger.intake.signatures import keys
from ledger.intake.signatures.base import HeaderMap
from ledger.intake.signatures.body_signature import BodySignature
from ledger.intake.signatures.fields import BodyDigestId, BodyPath, First, Header, Text
from ledger.intake.signatures.item_signatures import ItemSignatures, adyen_items, adyen_key
from ledger.intake.signatures.profile import (
    JSON_ARRAY,
    SecretFormat,
    SenderProfile,
    public_key_format,
)
from ledger.intake.signatures.schemes import Entries, HeaderSet, SignedContent, Single, Template
from ledger.intake.signatures.sns import SnsSignature, sns_public_key

BODY = Template("{body}")
DIGEST_ID = BodyDigestId()

# Calendly (developer.calendly.com "Webhook signatures"): `Calendly-Webhook-Signature:
# t=<unix>,v1=<hex>`, HMAC-SHA256 of `{t}.{body}` under the webhook signing key. Its
# events carry no delivery id: the id is made from the signed body.
CALENDLY = SenderProfile(
    name="calendly",
    scheme=SignedContent(
        headers=(HeaderSet(signature="Calendly-Webhook-Signature"),),
        format=Entries(separator=",", pair="=", timestamp="t"), encoding="hex",
        algorithms={"v1": keys.HMAC_SHA256}, content=Template("{timestamp}.{body}")),
    event_id=DIGEST_ID, event_type=BodyPath.of("event"), id_is_signed=True,
    example=lambda i, t, data: {
        "created_at": "2026-01-01T00:00:00.000000Z", "created_by": "https://api.calendly.com/u/1",
        "payload": {"uri": f"https://api.calendly.com/scheduled_events/e/invitees/{i}",
                    **data}},
)

TWITCH_EVENT = BodyPath.of("event")
TWITCH_SUBSCRIPTION_TYPE = BodyPath.of("subscription.type")
REVOCATION = "revocation"


@dataclass(frozen=True, slots=True)
class TwitchType:
    """A notification's `subscription.type`; a revocation's, after `revocation.`."""

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the subscription type, marked when the message carries no event."""
        kind = TWITCH_SUBSCRIPTION_TYPE.read(headers, payload, body)
        if TWITCH_EVENT.read(headers, payload, body) is not None or not isinstance(kind, str):
            return kind
        return f"{REVOCATION}.{kind}"

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write a notification of this subscription type."""
        TWITCH_SUBSCRIPTION_TYPE.put(value, headers, payload)


def _twitch_challenge(payload: Any, secret: str) -> tuple[int, dict[str, Any] | str] | None:
    """Answer `webhook_callback_verification` with the bare challenge, as text (Twitch's rule)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("subscription"), dict):
        return None
    challenge = payload.get("challenge")
    return (200, challenge) if isinstance(challenge, str) and challenge else None


# Twitch EventSub (dev.twitch.tv "Handling webhook events"): `Twitch-Eventsub-Message-
# Signature: sha256=<hex>` of `{message id}{timestamp}{body}`, the timestamp RFC 3339
# with nanoseconds; the challenge is answered after authentication. Twitch suggests a
# 10-minute window: `--tolerance 600`.
TWITCH = SenderProfile(
    name="twitch",
    scheme=SignedContent(
        headers=(HeaderSet(signature="Twitch-Eventsub-Message-Signature",
                           timestamp="Twitch-Eventsub-Message-Timestamp",
                           id="Twitch-Eventsub-Message-Id"),),
        format=Single(prefix="sha256=", version="sha256"), encoding="hex",
        algorithms={"sha256": keys.HMAC_SHA256}, content=Template("{id}{timestamp}{body}"),
        timestamp_format="rfc3339"),
    event_id=Header("Twitch-Eventsub-Message-Id"), event_type=TwitchType(), id_is_signed=True,
    handshake=_twitch_challenge,
    example=lambda i, t, data: {
        "subscription": {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "status": "enabled",
                         "version": "1", "transport": {"method": "webhook"}},
        "event": data},
)

# Zendesk (developer.zendesk.com "Verifying webhook authenticity"): base64 HMAC-SHA256
# of `{timestamp}{body}`, the timestamp ISO 8601 in X-Zendesk-Webhook-Signature-Timestamp.
# Event webhooks carry `id` and `type`; a trigger's custom body may carry neither
# (`--event-type`; the id is then made from the signed body).
ZENDESK = SenderProfile(
    name="zendesk",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Zendesk-Webhook-Signature",
                           timestamp="X-Zendesk-Webhook-Signature-Timestamp"),),
        format=Single(), encoding="base64", algorithms={"sig": keys.HMAC_SHA256},
        content=Template("{timestamp}{body}"), timestamp_format="rfc3339"),
    event_id=First((BodyPath.of("id"), DIGEST_ID)), event_type=BodyPath.of("type"),
    id_is_signed=True,
    example=lambda i, t, data: {"account_id": 1, "subject": "zen:ticket:1", "detail": data,
                                "zendesk_event_version": "2022-11-06"},
)

# HubSpot v3 (developers.hubspot.com "Validating requests"): base64 HMAC-SHA256 of
# `{method}{uri}{body}{timestamp}` under the app's client secret, the timestamp in
# milliseconds; the body is a JSON array of events, each with a numeric eventId.
HUBSPOT = SenderProfile(
    name="hubspot",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-HubSpot-Signature-v3",
                           timestamp="X-HubSpot-Request-Timestamp"),),
        format=Single(version="v3"), encoding="base64", algorithms={"v3": keys.HMAC_SHA256},
        content=Template("{method}{url}{body}{timestamp}"), needs_url=True,
        timestamp_format="unix-ms"),
    event_id=Text(BodyPath.of("eventId")), event_type=BodyPath.of("subscriptionType"),
    id_is_signed=True, body_format=JSON_ARRAY,
    example=lambda i, t, data: {"portalId": 62515, "appId": 1160452,
                                "occurredAt": int(time.time() * 1000), "attemptNumber": 0,
                                "objectId": 123, **data},
)

# Intercom (developers.intercom.com "Webhooks", signed notifications): `X-Hub-Signature:
# sha1=<hex>`, HMAC-SHA1 of the body under the app's client secret; no timestamp.
INTERCOM = SenderProfile(
    name="intercom",
    scheme=SignedContent(
        headers=(HeaderSet(signature="X-Hub-Signature"),),
        format=Single(prefix="sha1=", version="sha1"), encoding="hex",
        algorithms={"sha1": keys.HMAC_SHA1}, content=BODY),
    event_id=BodyPath.of("id"), event_type=BodyPath.of("topic"), id_is_signed=True,
    example=lambda i, t, data: {"type": "notification_event", "app_id": "abc123",
                                "data": {"type": "notification_event_data", "item": data}},
)

# Typeform (typeform.com/developers "Secure your webhooks"): `Typeform-Signature:
# sha256=<base64>`, HMAC-SHA256 of the body; no timestamp.
TYPEFORM = SenderProfile(
    name="typeform",
    scheme=SignedContent(
        headers=(HeaderSet(signature="Typeform-Signature"),),
        format=Single(prefix="sha256=", version="sha256"), encoding="base64",
        algorithms={"sha256": keys.HMAC_SHA256}, content=BODY),
    event_id=BodyPath.of("event_id"), event_type=BodyPath.of("event_type"), id_is_signed=True,
    example=lambda i, t, data: {"form_response": {"form_id": "lT4Z3j", **data}},
)

# Mailgun (documentation.mailgun.com "Securing webhooks"): the body carries
# `signature: {timestamp, token, signature}`, hex HMAC-SHA256 of `{timestamp}{token}`
# under the webhook signing key. The event (`event-data`) is not signed: its id is
# treated as unsigned, so the body-digest guard applies, and each token is kept with the
# event it carried for the freshness window (as Mailgun advises): under another event, 401.
MAILGUN = SenderProfile(
    name="mailgun", scheme=BodySignature(),
    event_id=BodyPath.of("event-data.id"), event_type=BodyPath.of("event-data.event"),
    id_is_signed=False,
    covers="{signature.timestamp}{signature.token} only: NOT the event (event-data); a"
           " token already used by another event within the freshness window is refused",
    example=lambda i, t, data: {"event-data": {"recipient": "alice@example.com", **data}},
)

@dataclass(frozen=True, slots=True)
class AdyenId:
    """`{eventCode}:{pspReference}:{success}`: what makes an Adyen notification one event."""

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the joined id, or None when a part is missing or not text."""
        found = [payload.get(name) if isinstance(payload, dict) else None
                 for name in ("eventCode", "pspReference", "success")]
        parts = [part for part in found if isinstance(part, str) and part]
        return ":".join(parts) if len(parts) == len(found) else None

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Nothing to write: the example item carries the parts."""


def _adyen_example(event_id: str, event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """One notification item in Adyen's envelope."""
    item = {"pspReference": event_id, "merchantAccountCode": "Acme", "merchantReference": "r",
            "amount": {"value": 1000, "currency": "EUR"}, "eventCode": event_type,
            "eventDate": "2026-01-01T00:00:00+01:00", "success": "true",
            "additionalData": {}}
    return {"live": "false", "notificationItems": [{"NotificationRequestItem": item}]}


def _adyen_key_problem(secret: str) -> str | None:
    """An Adyen HMAC key is hex (Customer Area → Webhooks → HMAC key)."""
    return None if adyen_key(secret) else "an Adyen HMAC key is 32-256 hex digits"


# Adyen (docs.adyen.com "Verify HMAC signatures"): every notification item carries a
# base64 HMAC-SHA256 of its key fields under the hex HMAC key; each item is one event,
# all in one transaction; the reply is `[accepted]`. No timestamp is signed.
ADYEN = SenderProfile(
    name="adyen", scheme=ItemSignatures(), event_id=AdyenId(),
    event_type=BodyPath.of("eventCode"), id_is_signed=True, batch_items=adyen_items,
    success_body="[accepted]",
    covers="each item's pspReference:originalReference:merchantAccountCode:"
           "merchantReference:value:currency:eventCode:success (not its other fields)",
    secret=SecretFormat(generate=lambda: random.token_hex(32).upper(),
                        check=_adyen_key_problem),
    example=_adyen_example,
)

# AWS SNS (docs.aws.amazon.com/sns "Verifying the signatures of Amazon SNS messages"):
# RSA over the canonical fields, by the certificate the operator pins (never fetched
# at request time); a SubscriptionConfirmation is recorded for an operator to confirm.
AWS_SNS = SenderProfile(
    name="aws-sns", scheme=SnsSignature(), event_id=BodyPath.of("MessageId"),
    event_type=BodyPath.of("Type"), id_is_signed=True,
    covers="Message, MessageId, Subject, Timestamp, TopicArn, Type (Notification); "
           "also SubscribeURL and Token (confirmations)",
    secret=public_key_format(sns_public_key, "base64 DER SNS signing certificate"),
    example=lambda i, t, data: {"Type": "Notification", "MessageId": i,
                                "TopicArn": "arn:aws:sns:us-east-1:123456789012:ledger",
                                "Message": json.dumps(data)},
)

MORE_PRESETS = (CALENDLY, TWITCH, ZENDESK, HUBSPOT, INTERCOM, TYPEFORM, MAILGUN, ADYEN,
                AWS_SNS)
