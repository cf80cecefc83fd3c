"""Shared-token senders: the secret travels as-is in a header, a query parameter or Basic auth.

Such a token authenticates the sender, never the body: whoever saw one delivery
can send another. So the event id is never trusted as signed (the body-digest
guard applies), and the ledger refuses the token over plain HTTP in production
unless the operator allowed it (`--allow-plaintext`).

The web layer adds two facts as pseudo-headers (names no HTTP header can have),
and only for integrations of a token profile: `:query` (the raw query string) and
`:plaintext` (present when a production request did not arrive over HTTPS).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import HeaderMap, Verified

QUERY_KEY = ":query"
PLAINTEXT_KEY = ":plaintext"
AUTHORIZATION = "authorization"
BASIC = "basic "


def _digest(value: bytes) -> bytes:
    """Return a fixed-length stand-in, so the comparison time does not depend on lengths."""
    return hashlib.sha256(value).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedToken:
    """The sender repeats a shared secret; nothing it sends is signed."""

    header: str | None = None  # GitLab's X-Gitlab-Token, `--token-header`
    query: str | None = None  # `--token-query`
    basic: bool = False  # `--basic`: the secret is the whole `user:password` pair
    allow_plaintext: bool = True  # GitLab's preset predates the rule; `token` defaults False
    has_timestamp: bool = False

    def verify(self, headers: HeaderMap, body: bytes, secrets: Sequence[str], *,
               now: int, tolerance: int) -> Verified:
        """Return which live secret the delivery presents, or raise AuthenticationFailed."""
        common.require_secrets(secrets)
        if not self.allow_plaintext and headers.get(PLAINTEXT_KEY):
            raise AuthenticationFailed("plaintext_transport")
        presented = _digest(self._presented(headers))
        found = -1
        for index, secret in enumerate(secrets):
            key = common.utf8_key(secret)
            # Every live credential is compared, a match does not end the loop early.
            if key is not None and hmac.compare_digest(_digest(key), presented) and found < 0:
                found = index
        if found < 0:
            raise AuthenticationFailed("bad_signature")
        return Verified(secret_index=found, timestamp=None)

    def _presented(self, headers: HeaderMap) -> bytes:
        """Return the token as the delivery presents it, or raise missing_signature."""
        if self.basic:
            return _basic_pair(common.required_header(headers, AUTHORIZATION,
                                                      "missing_signature"))
        if self.query is not None:
            return _query_value(headers, self.query)
        return common.required_header(headers, (self.header or "").lower(),
                                      "missing_signature").encode()

    def sign(self, secret: str, body: bytes, *, event_id: str, timestamp: int) -> dict[str, str]:
        """Return what the sender attaches (a query token as the `:query` pseudo-header)."""
        if self.basic:
            return {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}
        if self.query is not None:
            return {QUERY_KEY: urlencode({self.query: secret})}
        return {self.header or "": secret}


def _basic_pair(value: str) -> bytes:
    """Return the `user:password` bytes of an `Authorization: Basic …` header."""
    if value[:len(BASIC)].lower() != BASIC:
        raise AuthenticationFailed("no_supported_signature")
    try:
        pair = base64.b64decode(value[len(BASIC):].strip(), validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("malformed_signature") from None
    if b":" not in pair:
        raise AuthenticationFailed("malformed_signature")
    return pair


def _query_value(headers: HeaderMap, name: str) -> bytes:
    """Return the one value of query parameter `name`."""
    raw = headers.get(QUERY_KEY) or ("",)
    values = [value for key, value in parse_qsl(raw[0], keep_blank_values=True)
              if key == name]
    if len(values) > 1:
        raise AuthenticationFailed("duplicate_header")
    if not values or not values[0]:
        raise AuthenticationFailed("missing_signature")
    return values[0].encode()
