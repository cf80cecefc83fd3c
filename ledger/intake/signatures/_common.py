"""Strict header, timestamp and HMAC checks shared by the sender profiles.

Every refusal raises AuthenticationFailed with a short machine reason. Messages
never carry a secret, a signature or body content: the reason is all they say.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures.base import HeaderMap

# Plain decimal seconds, no sign, no leading zero. Ten digits last until 2286;
# fifteen still let a milliseconds timestamp be refused as "future" (clearer in
# logs than "malformed"), while longer strings are refused before int() runs.
_TIMESTAMP = re.compile(r"[1-9][0-9]{0,14}")
# Senders emit lowercase hex; accepting other spellings would only widen the input.
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MILLIS = re.compile(r"[1-9][0-9]{0,17}")
# A full date-time with an explicit offset (RFC 3339 section 5.6): no local times.
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}"
                      r"(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})")


def is_printable_ascii(value: str) -> bool:
    """Return True when every character of `value` is printable ASCII."""
    return value.isascii() and value.isprintable()


def _values(headers: HeaderMap, name: str) -> Sequence[str]:
    """Return every value received for `name` (lower-case), refusing a bare string."""
    values = headers.get(name) or ()
    if isinstance(values, str | bytes):
        # A bare string would read as a list of characters: a caller bug, fail loudly.
        raise TypeError("headers must map each name to a list of values")
    return values


def required_header(headers: HeaderMap, name: str, missing: str) -> str:
    """Return the one value of header `name`, or raise AuthenticationFailed."""
    values = _values(headers, name)
    if len(values) > 1:
        raise AuthenticationFailed("duplicate_header")
    if not values or not values[0]:
        raise AuthenticationFailed(missing)
    value = values[0]
    if not isinstance(value, str) or not is_printable_ascii(value):
        raise AuthenticationFailed("malformed_header")
    return value


def header_as_sent(headers: HeaderMap, name: str) -> Any:
    """Return the value of `name`: None if absent, a list if repeated; never raise."""
    values = headers.get(name) or ()
    if isinstance(values, str | bytes):
        return None
    if len(values) > 1:
        # Every value, so the caller's validation refuses the ambiguity.
        return list(values)
    return values[0] if values else None


def media_type(headers: HeaderMap) -> str:
    """Return the delivery's Content-Type without parameters, lower-cased ('' if absent)."""
    values = headers.get("content-type") or ()
    if isinstance(values, str | bytes) or len(values) != 1:
        return ""  # absent or sent twice: no declared type, the profile's default applies
    return values[0].partition(";")[0].strip().lower()


# The longest Content-Type a work item keeps (a destination forwards it as received).
CONTENT_TYPE_LIMIT = 255


def received_content_type(headers: HeaderMap) -> str | None:
    """Return the Content-Type as received if usable (one value, 1-255 printable ASCII)."""
    values = headers.get("content-type") or ()
    if isinstance(values, str | bytes) or len(values) != 1:
        return None
    value = values[0].strip()
    # isascii + isprintable: 0x20-0x7E, checked in C (this runs on every delivery).
    if not value or len(value) > CONTENT_TYPE_LIMIT or not (value.isascii()
                                                            and value.isprintable()):
        return None  # unusable as a forwarded header: the body's format's type is sent
    return value


def require_secrets(secrets: Sequence[str]) -> None:
    """Refuse at once when the integration has no live secret."""
    if not secrets:
        raise AuthenticationFailed("no_secret")


def parse_timestamp(value: str) -> int:
    """Return the unix seconds in `value`, or raise malformed_timestamp."""
    if not _TIMESTAMP.fullmatch(value):
        raise AuthenticationFailed("malformed_timestamp")
    return int(value)


def parse_millis(value: str) -> int:
    """Return the unix seconds in a unix-milliseconds `value` (HubSpot), or raise."""
    if not _MILLIS.fullmatch(value):
        raise AuthenticationFailed("malformed_timestamp")
    return int(value) // 1000


def parse_rfc3339(value: str) -> int:
    """Return the unix seconds of an RFC 3339 time with an offset (Twitch, Zendesk), or raise."""
    if not _RFC3339.fullmatch(value):
        raise AuthenticationFailed("malformed_timestamp")
    fraction = value.find(".")
    if fraction != -1:  # nanoseconds (Twitch) are more than datetime holds: cut to micro
        end = fraction + 1
        while end < len(value) and value[end].isdigit():
            end += 1
        value = value[:min(end, fraction + 7)] + value[end:]
    try:
        return int(datetime.fromisoformat(value.upper()).timestamp())
    except ValueError:
        raise AuthenticationFailed("malformed_timestamp") from None


TIMESTAMP_PARSERS: dict[str, Callable[[str], int]] = {
    "unix": parse_timestamp, "unix-ms": parse_millis, "rfc3339": parse_rfc3339}
# How a sender spells unix seconds in each format (signing: tests, drills, demos).
TIMESTAMP_FORMATTERS: dict[str, Callable[[int], str]] = {
    "unix": str, "unix-ms": lambda seconds: str(seconds * 1000),
    "rfc3339": lambda seconds: datetime.fromtimestamp(seconds, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")}


def check_freshness(timestamp: int, *, now: int, tolerance: int) -> None:
    """Refuse a timestamp more than `tolerance` seconds from `now` either way."""
    if timestamp < now - tolerance:
        raise AuthenticationFailed("stale_timestamp")
    if timestamp > now + tolerance:
        raise AuthenticationFailed("future_timestamp")


def parse_sha256_hex(value: str) -> bytes:
    """Return the digest spelled by 64 lowercase hex digits, or raise."""
    if not _SHA256_HEX.fullmatch(value):
        raise AuthenticationFailed("malformed_signature")
    return bytes.fromhex(value)


def utf8_key(secret: str) -> bytes | None:
    """Return `secret` as UTF-8 bytes, or None when it cannot be a key."""
    try:
        return secret.encode("utf-8") or None
    except (AttributeError, UnicodeEncodeError):
        return None


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """Return the raw HMAC-SHA256 of `message` under `key`."""
    return hmac.new(key, message, hashlib.sha256).digest()


def match_secret(
    secrets: Sequence[str],
    key_of: Callable[[str], bytes | None],
    message: bytes,
    candidates: Sequence[bytes],
) -> int:
    """Return the index of the first secret that signed `message`, or raise."""
    require_secrets(secrets)
    for index, secret in enumerate(secrets):
        key = key_of(secret)
        if key is None:
            continue  # an unusable stored secret matches nothing; it must not crash
        expected = hmac_sha256(key, message)
        matched = False
        for candidate in candidates:
            # No early exit: every candidate is compared, each in constant time.
            matched |= hmac.compare_digest(expected, candidate)
        if matched:
            return index
    raise AuthenticationFailed("bad_signature")
