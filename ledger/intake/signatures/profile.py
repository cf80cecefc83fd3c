"""A sender profile: a declaration over one scheme, two fields, a body format and a handshake."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets as random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from ledger.ids import random_base62
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import EventIdentity, HeaderMap, Verified
from ledger.intake.signatures.body_signature import BodySignature
from ledger.intake.signatures.fields import BodyPath, Field, Fixed
from ledger.intake.signatures.item_signatures import ItemSignatures
from ledger.intake.signatures.schemes import SignedContent, form_signed_params
from ledger.intake.signatures.shared_token import SharedToken
from ledger.intake.signatures.sns import SnsSignature

MAX_SECRET_LENGTH = 512

# Body formats: one JSON object, a JSON array of events (one receipt each), a form.
JSON = "json"
JSON_ARRAY = "json-array"
FORM = "form"
# The Content-Type that selects a profile's alternate format (Slack's forms, Twilio's JSON).
MEDIA_TYPES = {FORM: "application/x-www-form-urlencoded", JSON: "application/json"}

# A handshake gets the parsed body and the secret that verified it; it returns the
# status and body to answer at once (no receipt; 204 answers no body; a str is
# answered as text/plain, as Twitch wants its challenge), or None when the
# delivery is an event.
Handshake = Callable[[Any, str], tuple[int, dict[str, Any] | str] | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretFormat:
    """What a credential of this sender looks like, and how to make one."""

    generate: Callable[[], str] | None  # None: the sender issues it (a public key)
    check: Callable[[str], str | None]  # an error message, or None when usable
    is_public: Callable[[str], bool] = lambda secret: False


def printable(secret: str) -> str | None:
    """Refuse secrets nobody could have typed into the sender's console."""
    if not secret or len(secret) > MAX_SECRET_LENGTH or not secret.isprintable():
        return f"secret must be 1-{MAX_SECRET_LENGTH} printable characters"
    return None


RAW_SECRET = SecretFormat(generate=lambda: random.token_urlsafe(32), check=printable)
STRIPE_SECRET = SecretFormat(generate=lambda: "whsec_" + random_base62(32), check=printable)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderSetId:
    """The signed id header of whichever header set the delivery used (svix-id, webhook-id)."""

    scheme: SignedContent

    def read(self, headers: HeaderMap, payload: Any, body: bytes) -> Any:
        """Return the id header of the set the scheme verified."""
        names = self.scheme.header_set(headers)
        return common.header_as_sent(headers, names.id_key) if names.id_key else None

    def put(self, value: Any, headers: dict[str, str], payload: dict[str, Any]) -> None:
        """The scheme's sign() writes the id header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SenderProfile:
    """One sender's scheme, where its event id and type live, and what its body is."""

    name: str
    scheme: SignedContent | SharedToken | BodySignature | ItemSignatures | SnsSignature
    event_id: Field
    event_type: Field
    # False when the event id is not covered by the signature: a captured body
    # could be replayed under a fresh id, so the body-digest guard applies.
    id_is_signed: bool
    secret: SecretFormat = RAW_SECRET
    body_format: str = JSON
    # The format a delivery has instead when its Content-Type declares it: Slack posts
    # slash commands and interactivity as forms, Twilio some products as JSON.
    alternate_format: str | None = None
    # A form field whose value is a JSON object (Slack interactivity's `payload`),
    # decoded in place so handlers and the id/type fields see the object.
    form_json_field: str | None = None
    # True when the signature covers the decoded form fields, not the bytes (Twilio).
    signs_decoded_form: bool = False
    handshake: Handshake | None = None
    # The body limit when the integration sets none, fitted to the sender's own cap
    # (GitHub's 25 MB); None: LEDGER_MAX_BODY_BYTES.
    max_body_bytes: int | None = None
    # What the signature covers, in words, when the scheme's template does not say it
    # all (catalog.py shows it in `integration create --help` and the dashboard).
    covers: str | None = None
    # Text answered (text/plain) instead of the JSON body when a delivery is taken:
    # some senders want a literal reply (Adyen's `[accepted]`).
    success_body: str | None = None
    # The events of a batch inside an object body (Adyen's notificationItems): each
    # gets its own receipt, as a JSON-array body's elements do.
    batch_items: Callable[[Any], list[Any] | None] | None = None
    example: Callable[[str, str, dict[str, Any]], dict[str, Any]] | None = None

    @property
    def has_timestamp(self) -> bool:
        """Tell whether deliveries carry a signed timestamp (freshness is checked)."""
        return self.scheme.has_timestamp

    def format_of(self, headers: HeaderMap) -> str:
        """Return this delivery's body format: the alternate one when its Content-Type says so."""
        alternate = self.alternate_format
        if alternate is not None and common.media_type(headers) == MEDIA_TYPES[alternate]:
            return alternate
        return self.body_format

    def verify(self, headers: HeaderMap, body: bytes, secrets: Sequence[str], *,
               now: int, tolerance: int) -> Verified:
        """Return which secret signed `body`, or raise AuthenticationFailed."""
        return self.scheme.verify(headers, body, secrets, now=now, tolerance=tolerance)

    def signed_digest(self, body: bytes) -> bytes:
        """Return the SHA-256 of what the signature covers of `body` (the dedup digest).

        Bodies the signature cannot tell apart get one digest, so a captured delivery
        re-sent in another signature-equivalent shape is a duplicate, never new work.
        """
        if self.signs_decoded_form:
            return hashlib.sha256(form_signed_params(body)).digest()
        return hashlib.sha256(body).digest()

    def identity(self, headers: HeaderMap, payload: Any, body: bytes = b"") -> EventIdentity:
        """Find the event id and type in the headers or the parsed body, unvalidated."""
        return EventIdentity(event_id=self.event_id.read(headers, payload, body),
                             event_type=self.event_type.read(headers, payload, body))

    def sign(self, secret: str, body: bytes, *, event_id: str, event_type: str,
             timestamp: int) -> dict[str, str]:
        """Return the headers the real sender would attach to `body`."""
        headers = self.scheme.sign(secret, body, event_id=event_id, timestamp=timestamp)
        unused: dict[str, Any] = {}
        for found, value in ((self.event_id, event_id), (self.event_type, event_type)):
            if not isinstance(found, BodyPath):
                found.put(value, headers, unused)
        return headers

    def compose(self, event_id: str, event_type: str, data: dict[str, Any]) -> bytes:
        """Return a body in the sender's shape carrying this id, type and data."""
        payload = self.example(event_id, event_type, data) if self.example else {"data": data}
        unused: dict[str, str] = {}
        for found, value in ((self.event_id, event_id), (self.event_type, event_type)):
            found.put(value, unused, payload)
        if self.body_format == FORM:
            return urlencode(payload).encode()
        body = [payload] if self.body_format == JSON_ARRAY else payload
        return json.dumps(body, separators=(",", ":")).encode()

    @property
    def signature_in_body(self) -> bool:
        """Tell whether the signature travels inside the body (Mailgun, Adyen): see `seal`."""
        return isinstance(self.scheme, BodySignature | ItemSignatures | SnsSignature)

    def seal(self, secret: str, body: bytes, timestamp: int) -> bytes:
        """Return `body` as the sender sends it: with its signature inside, if it has one."""
        if isinstance(self.scheme, BodySignature | ItemSignatures | SnsSignature):
            return self.scheme.seal(secret, body, timestamp)
        return body

    def generate_secret(self) -> str:
        """Return a fresh signing secret in the sender's format."""
        if self.secret.generate is None:
            raise ValueError(f"{self.name} needs the sender's public key: pass it on stdin")
        return self.secret.generate()

    def configured(self, *, type_path: str | None = None, event_type: str | None = None,
                   url: str | None = None) -> SenderProfile:
        """Return this profile with an integration's type source and endpoint URL."""
        changes: dict[str, Any] = {}
        if type_path:
            changes["event_type"] = BodyPath.of(type_path)
        elif event_type:
            changes["event_type"] = Fixed(event_type)
        if url and isinstance(self.scheme, SignedContent):
            changes["scheme"] = replace(self.scheme, url=url)
        return replace(self, **changes) if changes else self


def hmac_hex(secret: str, text: str) -> str:
    """Return the hex HMAC-SHA256 of `text` under the raw secret (Zoom's challenge answer)."""
    key = common.utf8_key(secret) or b""
    return hmac.new(key, text.encode(), "sha256").hexdigest()


def public_key_format(check: Callable[[str], Any], label: str) -> SecretFormat:
    """A credential that is the sender's public key: never generated, never secret."""
    return SecretFormat(
        generate=None,
        check=lambda secret: None if check(secret) is not None else f"not a {label}",
        is_public=lambda secret: True)

