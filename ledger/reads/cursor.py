"""Opaque keyset cursors: the last row's sort key, base64url JSON."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

MAX_CURSOR_LENGTH = 2048
# Instants the ledger can hold and do arithmetic on (windows, timezone shifts)
# without overflowing datetime; a cursor or filter outside them is refused.
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)
# Every integer in a cursor is a database id or count: it fits a signed 64-bit column.
MAX_CURSOR_INT = 2**63 - 1
MAX_CURSOR_TEXT = 512
# What a page holds: a read model of ledger.reads.models, or a plain dict.
Item = TypeVar("Item")


class BadCursor(ValueError):
    """A cursor that this server did not produce."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Page(Generic[Item]):
    """One page of a keyset list and the cursor of the next page (None on the last)."""

    items: list[Item] = field(default_factory=list)
    next_cursor: str | None = None


def encode_cursor(*values: Any) -> str:
    """Encode a sort key (str, int, aware datetime) as an opaque cursor."""
    plain = [{"t": v.isoformat()} if isinstance(v, datetime) else v for v in values]
    raw = json.dumps(plain, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, kinds: tuple[type, ...]) -> tuple[Any, ...]:
    """Decode a cursor whose values must have the given types, or raise BadCursor."""
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise BadCursor("cursor too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        plain = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadCursor("cursor is not valid") from None
    if not isinstance(plain, list) or len(plain) != len(kinds):
        raise BadCursor("cursor is not valid")
    values: list[Any] = []
    for kind, value in zip(kinds, plain, strict=True):
        values.append(_typed(kind, value))
    return tuple(values)


def in_instant_range(moment: datetime) -> bool:
    """Tell whether an aware instant lies where the ledger can compute with it."""
    try:
        return EARLIEST_INSTANT <= moment.astimezone(UTC) < LATEST_INSTANT
    except OverflowError:  # 0001-01-01T00:00+01:00 has no UTC instant
        return False


def storable_text(value: str) -> bool:
    """Tell whether both databases can compare against this text (no NUL, no lone surrogate)."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _typed(kind: type, value: Any) -> Any:
    """Check one decoded cursor value against its expected type and range."""
    if kind is datetime:
        try:
            moment = datetime.fromisoformat(value["t"])
        except (TypeError, KeyError, ValueError):
            raise BadCursor("cursor is not valid") from None
        if moment.tzinfo is None or not in_instant_range(moment):
            raise BadCursor("cursor is not valid")
        return moment
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)
                        or not 0 <= value <= MAX_CURSOR_INT):
        raise BadCursor("cursor is not valid")
    if kind is str and (not isinstance(value, str) or len(value) > MAX_CURSOR_TEXT
                        or not storable_text(value)):
        raise BadCursor("cursor is not valid")
    return value
