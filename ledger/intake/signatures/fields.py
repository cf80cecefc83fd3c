"""Where a profile finds the event id and type: a header, a body path, a fixed value…

Each field reads what the sender put there without judging it (the pipeline
validates), and can `put` a value back, so tests, the demo and the drill build
deliveries in the sender's own shape from the same declaration.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import HeaderMap


class Field(Protocol):
    """A place in a delivery that holds the event id or type."""

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the value as sent (None when absent), never raising."""
        ...

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write `value` where the sender would."""
        ...


@dataclass(frozen=True, slots=True)
class Header:
    """A header (`X-GitHub-Delivery`); Shopify's topic swaps `/` for `.`."""

    name: str
    slash_as_dot: bool = False

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the header's value (a list when repeated, so validation refuses it)."""
        value = common.header_as_sent(headers, self.name.lower())
        if self.slash_as_dot and isinstance(value, str):
            return value.replace("/", ".")
        return value

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Set the header."""
        headers[self.name] = value.replace(".", "/") if self.slash_as_dot else value


@dataclass(frozen=True, slots=True)
class BodyPath:
    """A field of the JSON body, nested by a dotted path (`event.type`).

    `default` stands in when the sender left the field out (not when it is bad):
    Standard Webhooks only recommends a `type`.
    """

    path: tuple[str, ...]
    default: str | None = None

    @classmethod
    def of(cls, dotted: str, default: str | None = None) -> BodyPath:
        """Return the field at `dotted` (`data.object.kind`)."""
        return cls(tuple(dotted.split(".")), default)

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the value at the path, or the default when any step is missing."""
        value = payload
        for step in self.path:
            if not isinstance(value, dict):
                return self.default
            value = value.get(step)
        return self.default if value is None else value

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Set the value at the path, creating objects on the way."""
        node = payload
        for step in self.path[:-1]:
            node = node.setdefault(step, {})
        node[self.path[-1]] = value


@dataclass(frozen=True, slots=True)
class Text:
    """A field whose whole-number value is the id in decimal (HubSpot's numeric eventId)."""

    inner: Field

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return a whole number as its decimal text; anything else as sent."""
        value = self.inner.read(headers, payload, body)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return str(value)
        return value

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write the value as given."""
        self.inner.put(value, headers, payload)


@dataclass(frozen=True, slots=True)
class Fixed:
    """A type fixed per integration, for senders whose events carry none."""

    value: str

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the fixed value."""
        return self.value

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Nothing to write: the sender does not send it."""


@dataclass(frozen=True, slots=True)
class Dotted:
    """`first` + `.` + `second` when the second is there (GitHub `issues.opened`)."""

    first: Field
    second: Field

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Join the two parts; the first alone when the second is absent or odd."""
        head = self.first.read(headers, payload, body)
        tail = self.second.read(headers, payload, body)
        if isinstance(head, str) and isinstance(tail, str) and tail:
            return f"{head}.{tail}"
        return head

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Split at the first dot."""
        head, _, tail = value.partition(".")
        self.first.put(head, headers, payload)
        if tail:
            self.second.put(tail, headers, payload)


@dataclass(frozen=True, slots=True)
class Wrapped:
    """Slack: the inner event's type for `event_callback` envelopes, else the envelope's."""

    envelope: str
    outer: BodyPath
    inner: BodyPath

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the inner type inside the envelope, the outer type otherwise."""
        outer = self.outer.read(headers, payload, body)
        return self.inner.read(headers, payload, body) if outer == self.envelope else outer

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Wrap the event in the envelope."""
        self.outer.put(self.envelope, headers, payload)
        self.inner.put(value, headers, payload)


@dataclass(frozen=True, slots=True)
class Named:
    """A numeric code named by a table (Discord's interaction types)."""

    inner: Field
    names: Mapping[int, str]

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the code's name; an unknown code reads as itself (and fails validation)."""
        code = self.inner.read(headers, payload, body)
        if isinstance(code, int) and not isinstance(code, bool):
            return self.names.get(code, code)
        return code

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write the code of `value` (a name without a code is written as it is)."""
        codes = {name: code for code, name in self.names.items()}
        self.inner.put(codes.get(value, value), headers, payload)


@dataclass(frozen=True, slots=True)
class BodyDigest:
    """An id made from the signed body, for senders that send none (Zoom)."""

    prefix: str

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the prefix and 40 hex digits of the body's SHA-256."""
        return self.prefix + hashlib.sha256(body).hexdigest()[:40]

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Nothing to write: the id follows from the body."""


class _DigestIdMarker:
    """The type of DIGEST_ID (a sentinel the pipeline recognises by identity)."""

    def __repr__(self) -> str:
        return "DIGEST_ID"


# What BodyDigestId reads: the pipeline turns it into `sha256:<first 32 hex of the
# receipt's body digest>`, so the id follows the same digest the dedup compares.
DIGEST_ID: Any = _DigestIdMarker()
DIGEST_ID_PREFIX = "sha256:"
DIGEST_ID_HEX = 32


def digest_id(body_sha256: bytes) -> str:
    """Return the event id of an id-less delivery whose body digest is `body_sha256`."""
    return DIGEST_ID_PREFIX + body_sha256.hex()[:DIGEST_ID_HEX]


@dataclass(frozen=True, slots=True)
class BodyDigestId:
    """The id of a delivery the sender documents without one (CONTRACT section 2)."""

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the marker the pipeline replaces with the body-digest id."""
        return DIGEST_ID

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Nothing to write: the id follows from the body."""


@dataclass(frozen=True, slots=True)
class Matching:
    """`then` when the body field `marker` equals `value`, else `otherwise` (Slack's
    `app_rate_limited`, the one Slack delivery documented without an event_id)."""

    marker: BodyPath
    value: str
    then: Field
    otherwise: Field

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the value from the field the marker selects."""
        chosen = self.then if self.marker.read(headers, payload, body) == self.value else (
            self.otherwise)
        return chosen.read(headers, payload, body)

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write where the main shape keeps it."""
        self.otherwise.put(value, headers, payload)


@dataclass(frozen=True, slots=True)
class First:
    """The first of several places that holds a value (Slack: event_id, or a trigger_id)."""

    fields: tuple[Field, ...]

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the first value present, None when none is."""
        for found in self.fields:
            value = found.read(headers, payload, body)
            if value is not None:
                return value
        return None

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write where the first place is (the sender's main shape)."""
        self.fields[0].put(value, headers, payload)


@dataclass(frozen=True, slots=True)
class ByShape:
    """The field of the first shape whose marker the body has, else `otherwise`.

    One sender, several body shapes: a Slack slash command has `command`, an
    interaction `payload`, an Events API body neither. The shape decides alone:
    a marked body missing its field has no value, never another shape's.
    """

    shapes: tuple[tuple[BodyPath, Field], ...]
    otherwise: Field

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the value from the field of the body's shape."""
        for marker, found in self.shapes:
            if marker.read(headers, payload, body) is not None:
                return found.read(headers, payload, body)
        return self.otherwise.read(headers, payload, body)

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """Write the value where the default shape keeps it."""
        self.otherwise.put(value, headers, payload)
