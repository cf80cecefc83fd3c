"""The Standard Webhooks profile (standardwebhooks.com), symmetric `v1` signatures.

The sender signs `{webhook-id}.{webhook-timestamp}.{raw body}` with HMAC-SHA256
under the base64-decoded part of a `whsec_` secret, and sends one or more
space-separated `v1,<base64>` entries in `webhook-signature`. Entries of other
versions (e.g. the asymmetric `v1a`) are ignored. The event id is the signed
`webhook-id` header, so it cannot be swapped without breaking the signature.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from secrets import token_bytes
from typing import Any

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import EventIdentity, HeaderMap, Verified

SECRET_PREFIX = "whsec_"
_KEY_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_DIGEST_SIZE = 32


def decode_secret(secret: str) -> bytes | None:
    """Return the HMAC key inside a `whsec_` secret, or None when it holds none."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        return None
    encoded = secret.removeprefix(SECRET_PREFIX)
    if not _KEY_BASE64.fullmatch(encoded):
        return None
    # Senders publish keys with or without padding; restore it before decoding.
    bare = encoded.rstrip("=")
    try:
        key = base64.b64decode(bare + "=" * (-len(bare) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return key or None


def _decode_v1(value: str) -> bytes:
    """Return the digest of one `v1` entry; refuse anything but canonical base64."""
    try:
        digest = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("malformed_signature") from None
    if len(digest) != _DIGEST_SIZE or base64.b64encode(digest).decode("ascii") != value:
        raise AuthenticationFailed("malformed_signature")
    return digest


def _candidates(header: str) -> list[bytes]:
    """Return the digests of every `v1` entry of a `webhook-signature` header."""
    digests = []
    for entry in header.split(" "):
        version, comma, value = entry.partition(",")
        if not version or not comma:
            raise AuthenticationFailed("malformed_signature")
        if version == "v1":
            digests.append(_decode_v1(value))
    if not digests:
        raise AuthenticationFailed("no_supported_signature")
    return digests


class StandardWebhooksProfile:
    """Verify and produce Standard Webhooks signatures."""

    name = "standard-webhooks"
    id_is_signed = True
    has_timestamp = True

    def verify(
        self,
        headers: HeaderMap,
        body: bytes,
        secrets: Sequence[str],
        *,
        now: int,
        tolerance: int,
    ) -> Verified:
        """Return which secret signed `body`, or raise AuthenticationFailed."""
        common.require_secrets(secrets)
        msg_id = common.required_header(headers, "webhook-id", "missing_id")
        raw_timestamp = common.required_header(headers, "webhook-timestamp", "missing_timestamp")
        header = common.required_header(headers, "webhook-signature", "missing_signature")
        timestamp = common.parse_timestamp(raw_timestamp)
        message = f"{msg_id}.{raw_timestamp}.".encode("ascii") + body
        index = common.match_secret(secrets, decode_secret, message, _candidates(header))
        # Freshness after the signature: "stale" then means a genuine old message.
        common.check_freshness(timestamp, now=now, tolerance=tolerance)
        return Verified(secret_index=index, timestamp=timestamp)

    def sign(
        self, secret: str, body: bytes, *, event_id: str, event_type: str, timestamp: int
    ) -> dict[str, str]:
        """Return the `webhook-*` headers a Standard Webhooks sender would attach."""
        key = decode_secret(secret)
        if key is None:
            raise ValueError("secret is not a whsec_ base64 key")
        message = f"{event_id}.{timestamp}.".encode() + body
        digest = base64.b64encode(common.hmac_sha256(key, message)).decode("ascii")
        return {
            "webhook-id": event_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": f"v1,{digest}",
        }

    def identity(self, headers: HeaderMap, payload: dict[str, Any]) -> EventIdentity:
        """Return the `webhook-id` header and the body's `type`, unvalidated."""
        event_type = payload.get("type") if isinstance(payload, dict) else None
        return EventIdentity(
            event_id=common.header_as_sent(headers, "webhook-id"), event_type=event_type
        )

    def generate_secret(self) -> str:
        """Return `whsec_` and a base64 key of 24 random bytes."""
        return SECRET_PREFIX + base64.b64encode(token_bytes(24)).decode("ascii")


STANDARD_WEBHOOKS = StandardWebhooksProfile()
