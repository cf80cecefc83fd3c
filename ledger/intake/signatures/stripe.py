"""The Stripe profile: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`.

Stripe signs `{t}.{raw body}` with HMAC-SHA256 under the endpoint secret taken
as raw UTF-8 bytes (the whole `whsec_...` string, not a decoded key). Schemes
other than `v1` (e.g. the test-mode `v0`) are ignored. The event id and type
live in the signed body, so neither can be swapped without breaking the signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledger.errors import AuthenticationFailed
from ledger.ids import random_base62
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import EventIdentity, HeaderMap, Verified

HEADER = "stripe-signature"


def _parse_header(header: str) -> tuple[str, list[bytes]]:
    """Return the raw `t` value and the `v1` digests of a Stripe-Signature header."""
    raw_timestamp: str | None = None
    digests = []
    for item in header.split(","):
        key, equals, value = item.partition("=")
        if not key or not equals:
            raise AuthenticationFailed("malformed_signature")
        if key == "t":
            if raw_timestamp is not None:
                # Two timestamps: the signed one and the checked one could differ.
                raise AuthenticationFailed("malformed_signature")
            raw_timestamp = value
        elif key == "v1":
            digests.append(common.parse_sha256_hex(value))
    if raw_timestamp is None:
        raise AuthenticationFailed("missing_timestamp")
    if not digests:
        raise AuthenticationFailed("no_supported_signature")
    return raw_timestamp, digests


class StripeProfile:
    """Verify and produce Stripe webhook signatures."""

    name = "stripe"
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
        header = common.required_header(headers, HEADER, "missing_signature")
        raw_timestamp, digests = _parse_header(header)
        timestamp = common.parse_timestamp(raw_timestamp)
        message = f"{raw_timestamp}.".encode("ascii") + body
        index = common.match_secret(secrets, common.utf8_key, message, digests)
        # Freshness after the signature: "stale" then means a genuine old message.
        common.check_freshness(timestamp, now=now, tolerance=tolerance)
        return Verified(secret_index=index, timestamp=timestamp)

    def sign(
        self, secret: str, body: bytes, *, event_id: str, event_type: str, timestamp: int
    ) -> dict[str, str]:
        """Return the Stripe-Signature header; id and type travel in the body."""
        key = common.utf8_key(secret)
        if key is None:
            raise ValueError("secret is empty or not encodable")
        digest = common.hmac_sha256(key, f"{timestamp}.".encode() + body).hex()
        return {"Stripe-Signature": f"t={timestamp},v1={digest}"}

    def identity(self, headers: HeaderMap, payload: dict[str, Any]) -> EventIdentity:
        """Return the body's `id` and `type`, unvalidated."""
        if not isinstance(payload, dict):
            return EventIdentity(event_id=None, event_type=None)
        return EventIdentity(event_id=payload.get("id"), event_type=payload.get("type"))

    def generate_secret(self) -> str:
        """Return `whsec_` and 32 random base62 characters, like Stripe's own."""
        return "whsec_" + random_base62(32)


STRIPE = StripeProfile()
