"""Mailgun's scheme: the signature travels inside the body, and covers only two of its fields.

`{"signature": {"timestamp", "token", "signature"}, "event-data": {...}}`: the hex
HMAC-SHA256 of `{timestamp}{token}` under the webhook signing key. The event itself
(`event-data`) is NOT covered: a captured signature object could be pasted onto another
body. The ledger checks freshness, treats the event id as unsigned (the body-digest
guard applies) and returns the token: the intake keeps each token with the event it
carried for the freshness window and refuses it under another (Mailgun's own advice:
cache the token, honour no second request with it); docs/senders/mailgun.md.
"""

from __future__ import annotations

import json
import re
import secrets as random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import HeaderMap, Verified

_TOKEN = re.compile(r"[A-Za-z0-9]{1,200}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BodySignature:
    """A signature object inside the JSON body, over its timestamp and token."""

    container: str = "signature"
    has_timestamp: bool = True

    def verify(self, headers: HeaderMap, body: bytes, secrets: Sequence[str], *,
               now: int, tolerance: int) -> Verified:
        """Return which secret signed the body's signature object, or raise."""
        common.require_secrets(secrets)
        raw_timestamp, token, signature = self._fields(body)
        if not _TOKEN.fullmatch(token):
            raise AuthenticationFailed("malformed_signature")
        digest = common.parse_sha256_hex(signature)
        timestamp = common.parse_timestamp(raw_timestamp)
        index = common.match_secret(secrets, common.utf8_key,
                                    (raw_timestamp + token).encode(), [digest])
        common.check_freshness(timestamp, now=now, tolerance=tolerance)
        return Verified(secret_index=index, timestamp=timestamp, token=token)

    def _fields(self, body: bytes) -> tuple[str, str, str]:
        """Return the timestamp, token and signature strings, or raise missing_signature."""
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            raise AuthenticationFailed("missing_signature") from None
        found = payload.get(self.container) if isinstance(payload, dict) else None
        values = [found.get(name) if isinstance(found, dict) else None
                  for name in ("timestamp", "token", "signature")]
        texts = [value for value in values if isinstance(value, str) and value]
        if len(texts) != len(values):
            raise AuthenticationFailed("missing_signature")
        return texts[0], texts[1], texts[2]

    def sign(self, secret: str, body: bytes, *, event_id: str, timestamp: int) -> dict[str, str]:
        """No header: the signature is in the body (`seal`)."""
        return {}

    def seal(self, secret: str, body: bytes, timestamp: int) -> bytes:
        """Return `body` with a fresh signature object, as the sender writes it."""
        payload: dict[str, Any] = json.loads(body)
        token = random.token_hex(25)
        mac = common.hmac_sha256(common.utf8_key(secret) or b"",
                                 f"{timestamp}{token}".encode()).hex()
        payload[self.container] = {"timestamp": str(timestamp), "token": token,
                                   "signature": mac}
        return json.dumps(payload, separators=(",", ":")).encode()
