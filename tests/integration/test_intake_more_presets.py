"""The third-edition presets over real HTTP on both databases, each signed here exactly as
the sender's documentation describes it (standard library only, independent of the
ledger's schemes): Calendly, Twitch EventSub (with its challenge), Zendesk, HubSpot v3,
Intercom and Typeform."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from ledger.db.schema import receipts
from tests.helpers import Sender, ledger_counts, make_sender, send_http
from tests.profile_keys import KEYS, URL

NOTHING = {"receipts": 0, "jobs": 0, "conflicts": 0}


def connect(app: Any, name: str, **settings: Any) -> Sender:
    """Connect preset `name` with its test secret."""
    return make_sender(app, name=f"in-{name}", profile=name, secret=KEYS[name].stored,
                       **settings)


def mac(name: str, message: bytes, digest: str = "sha256") -> bytes:
    """HMAC of `message` under the sender's secret."""
    return hmac.new(KEYS[name].stored.encode(), message, digest).digest()


def receipt_rows(app: Any) -> list[tuple[str, str]]:
    """Return (event id, type) of every receipt."""
    with app.extensions["ledger"].engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            select(receipts.c.event_id, receipts.c.event_type).order_by(receipts.c.event_id))]


def rfc3339(moment: float, nanos: bool = False) -> str:
    """The timestamp as Twitch (nanoseconds) or Zendesk (seconds) spell it."""
    text = datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (".634234626Z" if nanos else "Z")


def test_calendly_entries_header_any_listed_signature(app, live) -> None:
    """`t=<unix>,v1=<hex>` over `{t}.{body}`; the id is made from the body."""
    sender = connect(app, "calendly")
    body = json.dumps({"created_at": "2026-01-01T00:00:00Z", "event": "invitee.created",
                       "payload": {"uri": "https://api.calendly.com/invitees/AAA"}}).encode()
    now = int(time.time())
    signature = mac("calendly", f"{now}.".encode() + body).hex()
    headers = {"Calendly-Webhook-Signature": f"t={now},v1={'0' * 64},v1={signature}"}
    first = send_http(live, sender, body, headers)
    assert first.status_code == 202, first.json()
    assert first.json()["event_id"] == "sha256:" + hashlib.sha256(body).hexdigest()[:32]
    assert send_http(live, sender, body, headers).json()["status"] == "duplicate"
    assert send_http(live, sender, body + b" ", headers).status_code == 401
    assert [t for _, t in receipt_rows(app)] == ["invitee.created"]


def twitch_headers(body: bytes, message_id: str, kind: str, *,
                   moment: float | None = None, secret: str | None = None) -> dict[str, str]:
    """The headers Twitch attaches: HMAC-SHA256 of id + timestamp + body."""
    stamp = rfc3339(time.time() if moment is None else moment, nanos=True)
    key = (secret or KEYS["twitch"].stored).encode()
    signature = hmac.new(key, message_id.encode() + stamp.encode() + body,
                         hashlib.sha256).hexdigest()
    return {"Twitch-Eventsub-Message-Id": message_id,
            "Twitch-Eventsub-Message-Timestamp": stamp,
            "Twitch-Eventsub-Message-Signature": "sha256=" + signature,
            "Twitch-Eventsub-Message-Type": kind, "Twitch-Eventsub-Message-Retry": "0"}


SUBSCRIPTION = {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "type": "channel.follow",
                "version": "2", "status": "enabled", "cost": 0,
                "condition": {"broadcaster_user_id": "12826"},
                "transport": {"method": "webhook", "callback": "https://example.com/webhooks"},
                "created_at": "2019-11-16T10:11:12.634234626Z"}


def test_twitch_challenge_is_echoed_as_text_only_after_authentication(app, live) -> None:
    """webhook_callback_verification: 200 with the bare challenge; forged: 401; no rows."""
    sender = connect(app, "twitch")
    body = json.dumps({"challenge": "pogchamp-kappa-360noscope-vohiyo",
                       "subscription": {**SUBSCRIPTION,
                                        "status": "webhook_callback_verification_pending"}}
                      ).encode()
    answer = send_http(live, sender, body,
                       twitch_headers(body, "m-1", "webhook_callback_verification"))
    assert (answer.status_code, answer.text) == (200, "pogchamp-kappa-360noscope-vohiyo")
    assert answer.headers["Content-Type"].startswith("text/plain")
    forged = twitch_headers(body, "m-1", "webhook_callback_verification", secret="wrong")
    assert send_http(live, sender, body, forged).status_code == 401
    assert ledger_counts(app) == NOTHING


def test_twitch_notification_and_revocation(app, live) -> None:
    """A notification's type is its subscription's; a revocation's says so; stale: 401."""
    sender = connect(app, "twitch", tolerance=600)
    note = json.dumps({"subscription": SUBSCRIPTION,
                       "event": {"user_id": "1337", "broadcaster_user_id": "12826"}}).encode()
    headers = twitch_headers(note, "m-2", "notification")
    assert send_http(live, sender, note, headers).status_code == 202
    revoked = json.dumps({"subscription": {**SUBSCRIPTION,
                                           "status": "authorization_revoked"}}).encode()
    assert send_http(live, sender, revoked, twitch_headers(revoked, "m-3", "revocation")).ok
    stale = twitch_headers(note, "m-4", "notification", moment=time.time() - 3600)
    assert send_http(live, sender, note, stale).status_code == 401
    assert receipt_rows(app) == [("m-2", "channel.follow"), ("m-3", "revocation.channel.follow")]


def test_zendesk_iso_timestamp_and_base64_signature(app, live) -> None:
    """base64 HMAC-SHA256 of `{timestamp}{body}`, the timestamp ISO 8601."""
    sender = connect(app, "zendesk")
    body = json.dumps({"id": "cbe4028c-7239-495d-b020-f22348516046",
                       "type": "zen:event-type:user.created", "account_id": 12514403,
                       "detail": {"id": "7"}}).encode()
    stamp = rfc3339(time.time())
    signature = base64.b64encode(mac("zendesk", stamp.encode() + body)).decode()
    headers = {"X-Zendesk-Webhook-Signature": signature,
               "X-Zendesk-Webhook-Signature-Timestamp": stamp}
    assert send_http(live, sender, body, headers).status_code == 202
    old = rfc3339(time.time() - 3600)
    stale = {"X-Zendesk-Webhook-Signature": base64.b64encode(
        mac("zendesk", old.encode() + body)).decode(),
        "X-Zendesk-Webhook-Signature-Timestamp": old}
    assert send_http(live, sender, body, stale).status_code == 401
    assert receipt_rows(app) == [("cbe4028c-7239-495d-b020-f22348516046",
                                  "zen:event-type:user.created")]


def test_hubspot_v3_batch_of_numeric_event_ids(app, live) -> None:
    """`{method}{uri}{body}{timestamp}` (ms), base64; each array element its own receipt."""
    sender = connect(app, "hubspot", endpoint_url=URL)
    events = [{"eventId": 1001, "subscriptionId": 7, "portalId": 62515, "appId": 1160452,
               "occurredAt": 1700000000000, "subscriptionType": "contact.creation",
               "attemptNumber": 0, "objectId": 123, "changeFlag": "CREATED"},
              {"eventId": 1002, "subscriptionId": 8, "portalId": 62515, "appId": 1160452,
               "occurredAt": 1700000000001, "subscriptionType": "contact.propertyChange",
               "attemptNumber": 0, "objectId": 123, "propertyName": "email"}]
    body = json.dumps(events).encode()
    millis = str(int(time.time() * 1000))
    signature = base64.b64encode(mac("hubspot", f"POST{URL}".encode() + body
                                     + millis.encode())).decode()
    headers = {"X-HubSpot-Signature-v3": signature, "X-HubSpot-Request-Timestamp": millis}
    answer = send_http(live, sender, body, headers)
    assert answer.status_code == 202, answer.json()
    assert [e["status"] for e in answer.json()["events"]] == ["accepted", "accepted"]
    assert receipt_rows(app) == [("1001", "contact.creation"), ("1002", "contact.propertyChange")]
    other_url = base64.b64encode(mac("hubspot", b"POSThttps://evil.example/" + body
                                     + millis.encode())).decode()
    assert send_http(live, sender, body, {**headers, "X-HubSpot-Signature-v3": other_url}
                ).status_code == 401


def test_intercom_sha1_of_the_body(app, live) -> None:
    """`X-Hub-Signature: sha1=<hex>`; id and topic from the notification."""
    sender = connect(app, "intercom")
    body = json.dumps({"type": "notification_event", "id": "notif_ccd8a4d0-f965-11e3",
                       "topic": "conversation.user.created", "app_id": "a86dr8yl",
                       "data": {"type": "notification_event_data", "item": {}}}).encode()
    headers = {"X-Hub-Signature": "sha1=" + mac("intercom", body, "sha1").hex()}
    assert send_http(live, sender, body, headers).status_code == 202
    assert send_http(live, sender, body.replace(b"a86", b"b86"), headers).status_code == 401
    assert receipt_rows(app) == [("notif_ccd8a4d0-f965-11e3", "conversation.user.created")]


def test_typeform_base64_signature(app, live) -> None:
    """`Typeform-Signature: sha256=<base64>` of the body."""
    sender = connect(app, "typeform")
    body = json.dumps({"event_id": "LtWXD3crgy", "event_type": "form_response",
                       "form_response": {"form_id": "lT4Z3j"}}).encode()
    headers = {"Typeform-Signature": "sha256=" + base64.b64encode(mac("typeform", body)).decode()}
    assert send_http(live, sender, body, headers).status_code == 202
    hex_spelled = {"Typeform-Signature": "sha256=" + mac("typeform", body).hex()}
    assert send_http(live, sender, body, hex_spelled).status_code == 401
    assert receipt_rows(app) == [("LtWXD3crgy", "form_response")]


def mailgun_body(event_id: str, event: str, *, key: str | None = None,
                 moment: int | None = None) -> bytes:
    """A Mailgun webhook body, its signature object written as Mailgun's docs describe."""
    timestamp = str(int(time.time()) if moment is None else moment)
    token = hashlib.sha256(event_id.encode()).hexdigest()[:50]
    signature = hmac.new((key or KEYS["mailgun"].stored).encode(),
                         (timestamp + token).encode(), hashlib.sha256).hexdigest()
    return json.dumps({"signature": {"timestamp": timestamp, "token": token,
                                     "signature": signature},
                       "event-data": {"id": event_id, "event": event,
                                      "recipient": "alice@example.com"}}).encode()


def test_mailgun_signature_inside_the_body(app, live) -> None:
    """Accepted with event-data's id and event; a foreign key or stale timestamp: 401."""
    sender = connect(app, "mailgun")
    body = mailgun_body("CPgfbmQMTCKtHW6uIWtuVe", "delivered")
    assert send_http(live, sender, body, {}).status_code == 202
    assert send_http(live, sender, body, {}).json()["status"] == "duplicate"
    assert send_http(live, sender, mailgun_body("x1", "opened", key="wrong"), {}).status_code == 401
    stale = mailgun_body("x2", "opened", moment=int(time.time()) - 3600)
    assert send_http(live, sender, stale, {}).status_code == 401
    assert receipt_rows(app) == [("CPgfbmQMTCKtHW6uIWtuVe", "delivered")]


def test_mailgun_captured_signature_on_a_changed_event_is_refused(app, live) -> None:
    """A captured signature object on a changed event under the same id: its token was
    used by the original, so 401 and nothing written (tests/integration/test_mailgun_tokens)."""
    sender = connect(app, "mailgun")
    body = mailgun_body("evt-9", "delivered")
    assert send_http(live, sender, body, {}).status_code == 202
    tampered = body.replace(b"alice@example.com", b"mallory@example.com")
    assert send_http(live, sender, tampered, {}).status_code == 401
    assert ledger_counts(app) == {"receipts": 1, "jobs": 1, "conflicts": 0}


def adyen_item(psp: str, event_code: str = "AUTHORISATION", value: int = 1130) -> dict[str, Any]:
    """One Adyen notification item, signed as Adyen's docs describe."""
    item = {"pspReference": psp, "merchantAccountCode": "TestMerchant",
            "merchantReference": "order-1", "amount": {"value": value, "currency": "EUR"},
            "eventCode": event_code, "success": "true",
            "eventDate": "2026-01-01T00:00:00+01:00"}
    message = ":".join([psp, "", "TestMerchant", "order-1", str(value), "EUR", event_code,
                        "true"]).encode()
    key = bytes.fromhex(KEYS["adyen"].stored)
    signature = base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()
    return {**item, "additionalData": {"hmacSignature": signature}}


def adyen_body(*items: dict[str, Any]) -> bytes:
    """Adyen's envelope."""
    return json.dumps({"live": "false", "notificationItems": [
        {"NotificationRequestItem": item} for item in items]}).encode()


def test_adyen_items_each_a_receipt_answered_accepted(app, live) -> None:
    """Each signed item is its own event, all in one transaction; the reply is [accepted]."""
    sender = connect(app, "adyen")
    body = adyen_body(adyen_item("7914073381342284"), adyen_item("7914073381342284", "CAPTURE"))
    answer = send_http(live, sender, body, {})
    assert (answer.status_code, answer.text) == (202, "[accepted]")
    assert receipt_rows(app) == [("AUTHORISATION:7914073381342284:true", "AUTHORISATION"),
                                 ("CAPTURE:7914073381342284:true", "CAPTURE")]
    retried = send_http(live, sender, body, {})  # duplicates of pending receipts
    assert (retried.status_code, retried.text) == (202, "[accepted]")
    assert ledger_counts(app)["receipts"] == 2


def test_adyen_one_tampered_item_refuses_the_whole_body(app, live) -> None:
    """An item whose signed fields changed: 401, nothing written."""
    sender = connect(app, "adyen")
    tampered = {**adyen_item("8815"), "amount": {"value": 1, "currency": "EUR"}}
    assert send_http(live, sender, adyen_body(adyen_item("8814"), tampered), {}).status_code == 401
    assert ledger_counts(app) == NOTHING


def test_aws_sns_confirmation_is_recorded_not_fetched_and_notifications_accepted(
        app, live) -> None:
    """SNS posts text/plain JSON; the confirmation becomes a receipt holding SubscribeURL."""
    from tests.unit.test_aws_sns import CONFIRMATION, NOTIFICATION, signed

    sender = connect(app, "aws-sns")
    plain = {"Content-Type": "text/plain; charset=UTF-8",
             "x-amz-sns-message-type": "SubscriptionConfirmation"}
    confirmation = signed({**CONFIRMATION, "Timestamp": rfc3339(time.time())})
    assert send_http(live, sender, confirmation, plain).status_code == 202
    note = signed({**NOTIFICATION, "Timestamp": rfc3339(time.time())}, "2")
    assert send_http(live, sender, note, {**plain, "x-amz-sns-message-type": "Notification"}).ok
    assert receipt_rows(app) == [
        (CONFIRMATION["MessageId"], "SubscriptionConfirmation"),
        (NOTIFICATION["MessageId"], "Notification")]
    forged = note.replace(b"orders", b"refunds")
    assert send_http(live, sender, forged, plain).status_code == 401
    assert ledger_counts(app)["receipts"] == 2
