"""The GitHub profile: `X-Hub-Signature-256: sha256=<hex>` over the raw body.

GitHub signs only the body, with HMAC-SHA256 under the webhook secret taken as
raw UTF-8 bytes. The legacy SHA-1 `X-Hub-Signature` header is never accepted.

Limits of this scheme, which no receiver can work around:

* GitHub sends no timestamp, so freshness cannot be checked: a captured
  delivery verifies forever (`has_timestamp = False`). Only the replay ledger
  (the same `X-GitHub-Delivery` seen twice) stops an exact replay.
* The delivery id and event name are headers outside the signature
  (`id_is_signed = False`): a captured body can be replayed under a fresh id.
  Rotate the secret if a delivery may have leaked.
"""

from __future__ import annotations

from collections.abc import Sequence
from secrets import token_urlsafe
from typing import Any

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import EventIdentity, HeaderMap, Verified

HEADER = "x-hub-signature-256"
DELIVERY_HEADER = "x-github-delivery"
EVENT_HEADER = "x-github-event"


def _candidate(header: str) -> bytes:
    """Return the digest of a `sha256=<hex>` header value."""
    scheme, equals, value = header.partition("=")
    if not equals:
        raise AuthenticationFailed("malformed_signature")
    if scheme != "sha256":
        raise AuthenticationFailed("no_supported_signature")
    return common.parse_sha256_hex(value)


class GitHubProfile:
    """Verify and produce GitHub webhook signatures."""

    name = "github"
    id_is_signed = False
    has_timestamp = False

    def verify(
        self,
        headers: HeaderMap,
        body: bytes,
        secrets: Sequence[str],
        *,
        now: int,
        tolerance: int,
    ) -> Verified:
        """Return which secret signed `body`, or raise; `now` and `tolerance` go unused."""
        common.require_secrets(secrets)
        candidate = _candidate(common.required_header(headers, HEADER, "missing_signature"))
        index = common.match_secret(secrets, common.utf8_key, body, [candidate])
        return Verified(secret_index=index, timestamp=None)

    def sign(
        self, secret: str, body: bytes, *, event_id: str, event_type: str, timestamp: int
    ) -> dict[str, str]:
        """Return the signature, delivery and event headers GitHub would send."""
        key = common.utf8_key(secret)
        if key is None:
            raise ValueError("secret is empty or not encodable")
        return {
            "X-Hub-Signature-256": "sha256=" + common.hmac_sha256(key, body).hex(),
            "X-GitHub-Delivery": event_id,
            # GitHub names the event only; the `.action` part comes from the body.
            "X-GitHub-Event": event_type.partition(".")[0],
        }

    def identity(self, headers: HeaderMap, payload: dict[str, Any]) -> EventIdentity:
        """Return the delivery id and `event[.action]`, unvalidated."""
        event = common.header_as_sent(headers, EVENT_HEADER)
        action = payload.get("action") if isinstance(payload, dict) else None
        if isinstance(event, str) and isinstance(action, str) and action:
            event = f"{event}.{action}"
        return EventIdentity(
            event_id=common.header_as_sent(headers, DELIVERY_HEADER), event_type=event
        )

    def generate_secret(self) -> str:
        """Return 43 random URL-safe characters (256 bits)."""
        return token_urlsafe(32)


GITHUB = GitHubProfile()
