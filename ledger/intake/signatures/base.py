"""What every sender profile provides: verify, sign, and find the event identity.

The presets implement it as data (profile.SenderProfile over schemes.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Headers as the intake passes them: lower-cased names, every value received
# (a header sent twice appears twice, so profiles can refuse duplicates).
HeaderMap = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Verified:
    """A signature that matched one of the live secrets."""

    secret_index: int
    timestamp: int | None
    # The signed one-time token of a scheme whose signature covers a token, not the event
    # (Mailgun): the intake refuses it under another event within the freshness window.
    token: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventIdentity:
    """The event id and type as the sender put them, not yet validated."""

    event_id: Any
    event_type: Any


class Profile(Protocol):
    """A sender's signature scheme."""

    name: str
    # False when the event id is not covered by the signature (GitHub): a
    # captured body can then be replayed under a fresh id.
    id_is_signed: bool
    has_timestamp: bool

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
        ...

    def sign(
        self, secret: str, body: bytes, *, event_id: str, event_type: str, timestamp: int
    ) -> dict[str, str]:
        """Return the headers the real sender would attach to `body`."""
        ...

    def identity(self, headers: HeaderMap, payload: Any, body: bytes = b"") -> EventIdentity:
        """Find the event id and type in the headers, the parsed body or the raw body."""
        ...

    def generate_secret(self) -> str:
        """Return a fresh signing secret in the sender's format."""
        ...
