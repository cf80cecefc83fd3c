"""Verification schemes: how a sender's signature is read, what it covers, how it is checked.

Every preset profile is a declaration over two schemes:

* `SignedContent`: one header of signature entries (`t=…,v1=…`, `v1,… v1a,…`,
  `ts=…;h1=…`, `sha256=<hex>`, a bare value), a signed-content template over the
  event id, the timestamp, the raw body and the endpoint URL (or a function, for
  Twilio's sorted form parameters), and per entry name the algorithm that checks
  it: HMAC (any digest, hex or base64), ed25519 or ECDSA P-256 (`keys.py`).
* `SharedToken` (shared_token.py): the sender repeats a shared secret (GitLab, `token`).

Entries that are malformed or of an unknown name are skipped: they never spoil a
valid one (the senders' own libraries do the same). Freshness is checked after
the signature, so "stale" in the logs means a genuine old message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import HeaderMap, Verified
from ledger.intake.signatures.template import Template as Template
from ledger.intake.signatures.template import default_port_variant

JSON_TYPE = "application/json"
_LOWER_HEX = re.compile(r"[0-9a-f]+")


class Algorithm(Protocol):
    """One way to check a signature entry (keys.Hmac, keys.Ed25519, keys.EcdsaP256)."""

    @property
    def size(self) -> int:
        """Length of one raw signature in bytes (0: it varies)."""

    @property
    def key_of(self) -> Callable[[str], Any]:
        """Turn a stored credential into the key this algorithm checks with."""

    def matches(self, key: Any, message: bytes, candidates: Sequence[bytes]) -> bool: ...

    def sign(self, secret: str, message: bytes) -> bytes: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderSet:
    """The header names one delivery uses: signature, and maybe timestamp and signed id."""

    signature: str
    timestamp: str | None = None
    id: str | None = None
    # Lower-cased once: the intake passes header names lower-cased.
    signature_key: str = field(init=False)
    timestamp_key: str | None = field(init=False)
    id_key: str | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "signature_key", self.signature.lower())
        object.__setattr__(self, "timestamp_key", self.timestamp and self.timestamp.lower())
        object.__setattr__(self, "id_key", self.id and self.id.lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class Entries:
    """A header of `name<pair>value` entries joined by `separator` (`t=1,v1=ab,v1=cd`)."""

    separator: str
    pair: str
    timestamp: str | None = None  # the entry that carries the signed timestamp
    trim: bool = False  # allow spaces around entries (`v1=…, v1=…`)

    def parse(self, value: str) -> tuple[str | None, list[tuple[str, str]]]:
        """Return the raw timestamp entry and every other well-formed entry."""
        raw_timestamp: str | None = None
        entries = []
        for item in value.split(self.separator):
            name, pair, content = (item.strip() if self.trim else item).partition(self.pair)
            if not name or not pair or not content:
                continue  # malformed: skipped, never fatal
            if name == self.timestamp:
                if raw_timestamp is not None:
                    # Two timestamps: the signed one and the checked one could differ.
                    raise AuthenticationFailed("malformed_signature")
                raw_timestamp = content
            else:
                entries.append((name, content))
        return raw_timestamp, entries

    def format(self, version: str, signature: str, raw_timestamp: str | None) -> str:
        """Return the header value a sender would send for one signature."""
        entry = f"{version}{self.pair}{signature}"
        if self.timestamp is None:
            return entry
        return f"{self.timestamp}{self.pair}{raw_timestamp}{self.separator}{entry}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Single:
    """A header holding one signature after a fixed prefix (`sha256=<hex>`, `v0=…`, bare)."""

    prefix: str = ""
    version: str = "sig"

    def parse(self, value: str) -> tuple[str | None, list[tuple[str, str]]]:
        """Return no timestamp and the one entry, or refuse an unknown prefix."""
        if not value.startswith(self.prefix):
            raise AuthenticationFailed("no_supported_signature")
        return None, [(self.version, value[len(self.prefix):])]

    def format(self, version: str, signature: str, raw_timestamp: str | None) -> str:
        """Return the header value a sender would send."""
        return self.prefix + signature


def decode_signature(encoding: str, value: str, size: int) -> bytes | None:
    """Return the bytes of one canonical hex or base64 signature of `size` bytes (0: any)."""
    if encoding == "hex":
        if (size and len(value) != 2 * size) or not _LOWER_HEX.fullmatch(value):
            return None
        return bytes.fromhex(value) if len(value) % 2 == 0 else None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw or (size and len(raw) != size):
        return None
    # One spelling per signature: unused trailing bits or missing padding are refused.
    return raw if base64.b64encode(raw).decode("ascii") == value else None


def encode_signature(encoding: str, raw: bytes) -> str:
    """Return `raw` spelled as the sender spells signatures."""
    return raw.hex() if encoding == "hex" else base64.b64encode(raw).decode("ascii")


# Far more parameters than any Twilio webhook sends (a few dozen); a form with more is not
# Twilio's and is refused before it costs a parse.
MAX_FORM_FIELDS = 1000
# What Twilio's JSON mode appends to the URL; a form whose parameters spell it would
# make a captured JSON-mode signature verify a forged form (the content has no separators).
JSON_MODE_MARKERS = ("?bodySHA256=", "&bodySHA256=")


def form_signed_params(body: bytes) -> bytes:
    """The part of Twilio's signed form content after the URL: names and values, sorted.

    This is all the signature says about the body: a repeated pair, an empty pair
    (`&=`) or a name/value boundary moved (`AccountSi=dAC1`) leave it unchanged, so the
    intake's body digest is taken over it (SenderProfile.signed_digest), not the bytes.
    """
    try:
        # Bounded before any work: parse_qsl counts the separators first, so a body of
        # 349,000 empty pairs is refused in microseconds instead of parsed in a second.
        params = parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                           max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise AuthenticationFailed("malformed_body") from None
    names: dict[str, set[str]] = {}
    for name, value in params:
        names.setdefault(name, set()).add(value)
    return "".join(name + value for name in sorted(names)
                   for value in sorted(names[name])).encode("utf-8")


def form_content(msg_id: str, raw_timestamp: str, body: bytes, url: str) -> bytes:
    """Twilio's signed content: the URL, then each parameter name and value, sorted."""
    params = form_signed_params(body)
    if params.startswith(tuple(m.encode() for m in JSON_MODE_MARKERS)):
        raise AuthenticationFailed("mode_confusion")  # no Twilio form starts a name so
    return url.encode("utf-8") + params


def twilio_json_content(body: bytes, url: str) -> bytes:
    """Twilio's signed content for a JSON body: the URL with the body's `bodySHA256` appended.

    Twilio signs the URL it called, which carries the hex SHA-256 of the body as a
    query parameter; matching it proves the body. The configured URL is the one
    without that parameter, so it is appended here as Twilio appends it.
    """
    digest = hashlib.sha256(body).hexdigest()
    return f"{url}{'&' if '?' in url else '?'}bodySHA256={digest}".encode()


def settings_algorithm(value: str) -> str | None:
    """Return the `algorithm=` of a signature-settings header (`key=…,algorithm=HMAC_SHA256`)."""
    for part in value.split(","):
        name, pair, found = part.partition("=")
        if pair and name.strip() == "algorithm" and found.strip():
            return found.strip().upper()
    return None


def body_timestamp_ms(body: bytes, key: str) -> int:
    """Return the signed body's millisecond timestamp `key` in seconds (Linear)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise AuthenticationFailed("missing_timestamp") from None
    value = payload.get(key) if isinstance(payload, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise AuthenticationFailed("missing_timestamp")
    return value // 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class SignedContent:
    """Signatures over a signed-content template, checked per entry name."""

    headers: tuple[HeaderSet, ...]
    format: Entries | Single
    encoding: str  # "hex" | "base64"
    algorithms: Mapping[str, Algorithm]
    content: Callable[[str, str, bytes, str], bytes]
    body_timestamp: str | None = None  # a millisecond field of the signed body (Linear)
    url: str = ""  # the endpoint URL as the sender knows it (Twilio, Square)
    needs_url: bool = False
    # A header naming the algorithm of the signature (Twilio's shared keys:
    # `X-Twilio-Webhooks-Signature-Settings: key=…,algorithm=HMAC_SHA256`); absent,
    # the format's own entry name applies.
    algorithm_header: str | None = None
    # The signed content of a delivery whose Content-Type is JSON (Twilio's bodySHA256).
    json_content: Callable[[bytes, str], bytes] | None = None
    # True when the sender may sign the URL with or without its scheme's default port
    # (Twilio's libraries try both): the configured URL's other spelling verifies too.
    port_variants: bool = False
    timestamp_format: str = "unix"  # or "unix-ms" (HubSpot), "rfc3339" (Twitch, Zendesk)
    has_timestamp: bool = field(init=False)
    _urls: tuple[str, ...] = field(init=False, repr=False)
    _parse_timestamp: Callable[[str], int] = field(init=False, repr=False)
    _only: HeaderSet | None = field(init=False, repr=False)  # the one set, if only one

    def __post_init__(self) -> None:
        object.__setattr__(self, "_only", self.headers[0] if len(self.headers) == 1 else None)
        object.__setattr__(self, "_parse_timestamp",
                           common.TIMESTAMP_PARSERS[self.timestamp_format])
        object.__setattr__(self, "_urls", (self.url, *(
            [other] if self.port_variants and (other := default_port_variant(self.url)) else [])))
        timed = any(names.timestamp for names in self.headers)
        stamped = isinstance(self.format, Entries) and self.format.timestamp is not None
        object.__setattr__(self, "has_timestamp",
                           timed or stamped or self.body_timestamp is not None)

    def header_set(self, headers: HeaderMap) -> HeaderSet:
        """Return the header names this delivery uses (svix-* or webhook-*, say)."""
        if self._only is not None:
            return self._only
        found = self._present(headers)
        return found[0] if found else self.headers[0]

    def _present(self, headers: HeaderMap) -> list[HeaderSet]:
        """Return the sets the delivery carries; several only when they name one message.

        Svix can send its headers under both prefixes: accepted when both sets carry
        the same id and timestamp (which set is signed is then no question).
        """
        found = [names for names in self.headers if headers.get(names.signature_key)]
        if len(found) < 2:
            return found
        for other in found[1:]:
            for mine, theirs in ((found[0].id_key, other.id_key),
                                 (found[0].timestamp_key, other.timestamp_key)):
                if (mine is None) != (theirs is None) or (
                        mine and theirs and headers.get(mine) != headers.get(theirs)):
                    raise AuthenticationFailed("duplicate_header")
        return found

    def _signature_value(self, headers: HeaderMap) -> tuple[HeaderSet, str]:
        """Return the set used and its signature; with several sets, every set's entries."""
        found = self._present(headers)
        if len(found) < 2:  # the usual delivery: one set (or none: missing_signature)
            names = found[0] if found else self.headers[0]
            return names, common.required_header(headers, names.signature_key,
                                                 "missing_signature")
        values = [common.required_header(headers, names.signature_key, "missing_signature")
                  for names in found]
        if len(values) > 1 and isinstance(self.format, Entries):
            return found[0], self.format.separator.join(values)
        if len(set(values)) > 1:
            raise AuthenticationFailed("duplicate_header")  # two different single signatures
        return found[0], values[0]

    def verify(self, headers: HeaderMap, body: bytes, secrets: Sequence[str], *,
               now: int, tolerance: int) -> Verified:
        """Return which secret signed the delivery, or raise AuthenticationFailed."""
        common.require_secrets(secrets)
        if self._only is not None:
            names = self._only
            value = common.required_header(headers, names.signature_key, "missing_signature")
        else:
            names, value = self._signature_value(headers)
        msg_id = common.required_header(headers, names.id_key, "missing_id") if names.id_key else ""
        raw_timestamp, entries = self.format.parse(value)
        if self.algorithm_header is not None:
            entries = self._named_by_header(headers, entries)
        if names.timestamp_key is not None:
            raw_timestamp = common.required_header(headers, names.timestamp_key,
                                                   "missing_timestamp")
        elif isinstance(self.format, Entries) and self.format.timestamp and not raw_timestamp:
            raise AuthenticationFailed("missing_timestamp")
        timestamp = self._parse_timestamp(raw_timestamp) if raw_timestamp else None
        if self.needs_url and not self.url:
            raise AuthenticationFailed("no_endpoint_url")
        candidates = self._candidates(entries)
        index = -1
        for url in self._urls:
            if self.json_content is not None and common.media_type(headers) == JSON_TYPE:
                message = self.json_content(body, url)
            else:
                message = self.content(msg_id, raw_timestamp or "", body, url)
            try:
                index = self._match(secrets, message, candidates)
                break
            except AuthenticationFailed:
                if url is self._urls[-1]:
                    raise
        if self.body_timestamp is not None:
            timestamp = body_timestamp_ms(body, self.body_timestamp)
        if timestamp is not None:
            common.check_freshness(timestamp, now=now, tolerance=tolerance)
        return Verified(secret_index=index, timestamp=timestamp)

    def _named_by_header(self, headers: HeaderMap,
                         entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Rename the entries by the algorithm the settings header names, if it names one."""
        values = headers.get((self.algorithm_header or "").lower()) or ()
        if len(values) > 1:
            raise AuthenticationFailed("duplicate_header")
        named = settings_algorithm(values[0]) if values else None
        return [(named, value) for _, value in entries] if named else entries

    def _candidates(self, entries: list[tuple[str, str]]) -> dict[str, list[bytes]]:
        """Return the decoded signatures per algorithm name; skip what does not decode."""
        found: dict[str, list[bytes]] = {}
        malformed = False
        for name, value in entries:
            algorithm = self.algorithms.get(name)
            if algorithm is None:
                continue  # an unknown version is skipped
            raw = decode_signature(self.encoding, value, algorithm.size)
            if raw is None:
                malformed = True
                continue
            if name in found:
                found[name].append(raw)
            else:
                found[name] = [raw]
        if not found:
            raise AuthenticationFailed("malformed_signature" if malformed
                                       else "no_supported_signature")
        return found

    def _match(self, secrets: Sequence[str], message: bytes,
               candidates: dict[str, list[bytes]]) -> int:
        """Return the index of the first secret any candidate verifies under, or raise."""
        for index, secret in enumerate(secrets):
            for name, signatures in candidates.items():
                algorithm = self.algorithms[name]
                key = algorithm.key_of(secret)
                if key is not None and algorithm.matches(key, message, signatures):
                    return index
        raise AuthenticationFailed("bad_signature")

    def sign(self, secret: str, body: bytes, *, event_id: str, timestamp: int) -> dict[str, str]:
        """Return the headers the sender attaches; the first algorithm that takes `secret`."""
        names = self.headers[0]
        raw_timestamp = common.TIMESTAMP_FORMATTERS[self.timestamp_format](timestamp)
        message = self.content(event_id, raw_timestamp, body, self.url)
        for version, algorithm in self.algorithms.items():
            try:
                raw = algorithm.sign(secret, message)
            except ValueError:
                continue
            headers = {names.signature: self.format.format(
                version, encode_signature(self.encoding, raw), raw_timestamp)}
            if names.timestamp:
                headers[names.timestamp] = raw_timestamp
            if names.id:
                headers[names.id] = event_id
            return headers
        raise ValueError("secret is not in this sender's format")
