"""Adyen's scheme: each notification item of the body carries its own HMAC, over its fields.

`{"live": "false", "notificationItems": [{"NotificationRequestItem": {…,
"additionalData": {"hmacSignature": B}}}]}`: B is the base64 HMAC-SHA256, under the
hex-decoded HMAC key, of `pspReference:originalReference:merchantAccountCode:
merchantReference:value:currency:eventCode:success` (docs.adyen.com "Verify HMAC
signatures"). Every item must verify; fields outside that list are not signed.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import HeaderMap, Verified

ITEMS = "notificationItems"
ITEM = "NotificationRequestItem"
_HEX_KEY = re.compile(r"(?:[0-9A-Fa-f]{2}){16,128}")


def adyen_items(payload: Any) -> list[Any] | None:
    """Return the notification items of an Adyen body (None when it has none)."""
    items = payload.get(ITEMS) if isinstance(payload, dict) else None
    if not isinstance(items, list) or not items:
        return None
    return [item.get(ITEM) if isinstance(item, dict) else item for item in items]


def adyen_key(secret: str) -> bytes | None:
    """Return the HMAC key of a hex Adyen key, None when it is not one."""
    return bytes.fromhex(secret) if isinstance(secret, str) and _HEX_KEY.fullmatch(secret) else None


def signing_string(item: dict[str, Any]) -> bytes:
    """Return the fields Adyen signs, colon-joined (empty for an absent field)."""
    found = item.get("amount")
    amount: dict[str, Any] = found if isinstance(found, dict) else {}
    values = (item.get("pspReference"), item.get("originalReference"),
              item.get("merchantAccountCode"), item.get("merchantReference"),
              amount.get("value"), amount.get("currency"), item.get("eventCode"),
              item.get("success"))
    return ":".join("" if value is None else str(value) for value in values).encode()


def _signature_of(item: Any) -> bytes:
    """Return the decoded `additionalData.hmacSignature` of one item, or raise."""
    extra = item.get("additionalData") if isinstance(item, dict) else None
    value = extra.get("hmacSignature") if isinstance(extra, dict) else None
    if not isinstance(value, str) or not value:
        raise AuthenticationFailed("missing_signature")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("malformed_signature") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemSignatures:
    """Every notification item signed on its own; the body as a whole is not."""

    has_timestamp: bool = False

    def verify(self, headers: HeaderMap, body: bytes, secrets: Sequence[str], *,
               now: int, tolerance: int) -> Verified:
        """Return the live key that signed every item, or raise AuthenticationFailed."""
        common.require_secrets(secrets)
        try:
            items = adyen_items(json.loads(body))
        except (ValueError, RecursionError):
            items = None
        if items is None:
            raise AuthenticationFailed("missing_signature")
        signed = [(signing_string(item if isinstance(item, dict) else {}), _signature_of(item))
                  for item in items]
        for index, secret in enumerate(secrets):
            key = adyen_key(secret)
            if key is None:
                continue
            matched = True
            for message, signature in signed:
                matched &= hmac.compare_digest(common.hmac_sha256(key, message), signature)
            if matched:
                return Verified(secret_index=index, timestamp=None)
        raise AuthenticationFailed("bad_signature")

    def sign(self, secret: str, body: bytes, *, event_id: str, timestamp: int) -> dict[str, str]:
        """No header: each item carries its signature (`seal`)."""
        return {}

    def seal(self, secret: str, body: bytes, timestamp: int) -> bytes:
        """Return `body` with every item signed, as Adyen sends it."""
        payload: dict[str, Any] = json.loads(body)
        key = adyen_key(secret)
        if key is None:
            raise ValueError("an Adyen HMAC key is hex")
        for item in adyen_items(payload) or []:
            mac = base64.b64encode(common.hmac_sha256(key, signing_string(item))).decode()
            item.setdefault("additionalData", {})["hmacSignature"] = mac
        return json.dumps(payload, separators=(",", ":")).encode()
