"""The `hmac` profile: an operator describes a sender without a preset.

Options (stored per integration as JSON, set by `ledger integration create
--profile hmac …`; docs/senders/hmac.md):

| option | meaning | default |
|---|---|---|
| `signature_header` | header holding the signature | required |
| `algorithm` | `sha256`, `sha1` or `sha512` | `sha256` |
| `encoding` | `hex` (lowercase) or `base64` | `hex` |
| `prefix` | text before the signature (`sha256=`) | none |
| `entries` | the header is `t=<ts>,v1=<sig>[,v1=<sig>…]` (rotation) | off |
| `content` | template: `{body}` once; `{timestamp}`, `{id}`, `{method}`, `{url}` anywhere | |
| | (default `{body}`) | |
| `timestamp_header` | header with the signed timestamp; freshness is then checked | none |
| `timestamp_format` | `unix`, `unix-ms` or `rfc3339` | `unix` |
| `id_header` / `id_path` | where the event id is: a header, or a dotted body path | one required |
| `type_header` | header naming the type (else `--type-path`, `--event-type`, body `type`) | none |
| `body_format` | `json` (one object) or `json-array` (a batch, one receipt each) | `json` |
| `success_body` | text answered instead of the JSON body on success (`[accepted]`) | none |

An id in a header that the template does not sign (`{id}`) is unsigned: the
body-digest guard applies, as for GitHub. `{url}` needs the integration's `--url`.
"""

from __future__ import annotations

import json
from typing import Any

from ledger.intake.signatures import _common as common
from ledger.intake.signatures import keys
from ledger.intake.signatures.fields import BodyPath, Field, Header
from ledger.intake.signatures.profile import JSON, JSON_ARRAY, SenderProfile
from ledger.intake.signatures.schemes import Entries, HeaderSet, SignedContent, Single, Template

ENTRY_VERSION = "v1"  # `t=<ts>,v1=<sig>`: Stripe's shape, which Calendly and others copy
HEADER_NAME = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
OPTION_NAMES = ("signature_header", "algorithm", "encoding", "prefix", "content",
                "timestamp_header", "id_header", "id_path", "type_header", "entries",
                "timestamp_format", "body_format", "success_body")
BODY_FORMATS = (JSON, JSON_ARRAY)
MAX_SUCCESS_BODY = 200


def header_option(options: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """Return a lower-cased header option, refusing what no HTTP header can be called."""
    value = options.get(name)
    if value in (None, ""):
        if required:
            raise ValueError(f"the hmac profile needs {name.replace('_', '-')}")
        return None
    if not isinstance(value, str) or not set(value.lower()) <= HEADER_NAME or len(value) > 100:
        raise ValueError(f"{name.replace('_', '-')} must be an HTTP header name")
    return value.lower()


def _text(value: Any, what: str, limit: int = 2000) -> str:
    """Return `value` if it is printable ASCII of at most `limit` characters."""
    if not isinstance(value, str) or not value.isascii() or not value.isprintable() or (
            len(value) > limit):
        raise ValueError(f"{what} must be printable ASCII of at most {limit} characters")
    return value


def _choice(options: dict[str, Any], name: str, choices: Any, default: str) -> str:
    """Return option `name` if it is one of `choices`."""
    value = options.get(name) or default
    if value not in choices:
        raise ValueError(f"{name.replace('_', '-')} must be one of {sorted(choices)}")
    return str(value)


def _check_sources(found: dict[str, Any], used: set[str]) -> None:
    """Refuse a template whose fields have no source, or a source nothing signs."""
    if "{body}" not in used:
        raise ValueError("the signed content must contain {body}")
    stamped = bool(found["timestamp_header"]) or found["entries"]
    if ("{timestamp}" in used) != stamped:
        raise ValueError("a timestamp (header or t= entry) and {timestamp} in the signed "
                         "content go together")
    if "{id}" in used and not found["id_header"]:
        raise ValueError("{id} in the signed content needs id-header")
    if found["entries"] and found["prefix"]:
        raise ValueError("signature entries take no prefix")


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Return the options normalised, or raise ValueError saying what is wrong."""
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise ValueError(f"unknown hmac options: {sorted(unknown)}")
    found: dict[str, Any] = {
        "signature_header": header_option(options, "signature_header", required=True),
        "timestamp_header": header_option(options, "timestamp_header"),
        "id_header": header_option(options, "id_header"),
        "type_header": header_option(options, "type_header")}
    found["algorithm"] = _choice(options, "algorithm", keys.HMAC_DIGESTS, "sha256")
    found["encoding"] = _choice(options, "encoding", ("hex", "base64"), "hex")
    found["timestamp_format"] = _choice(options, "timestamp_format",
                                        common.TIMESTAMP_PARSERS, "unix")
    found["body_format"] = _choice(options, "body_format", BODY_FORMATS, JSON)
    found["prefix"] = _text(options.get("prefix") or "", "prefix")
    found["content"] = _text(options.get("content") or "{body}", "signed content")
    found["entries"] = bool(options.get("entries"))
    success = options.get("success_body")
    found["success_body"] = _text(success, "success-body", MAX_SUCCESS_BODY) if success else None
    _check_sources(found, Template(found["content"]).placeholders)
    found["id_path"] = options.get("id_path") or None
    if bool(found["id_header"]) == bool(found["id_path"]):
        raise ValueError("give exactly one of id-header and id-path")
    if found["body_format"] == JSON_ARRAY and found["id_header"]:
        raise ValueError("a json-array batch takes each event's id from id-path")
    defaults = {"timestamp_format": "unix", "body_format": JSON}
    return {name: value for name, value in found.items()
            if value and defaults.get(name) != value}


def hmac_profile(options_json: str) -> SenderProfile:
    """Build the `hmac` profile an integration's stored options describe."""
    options = check_options(json.loads(options_json))
    id_header = options.get("id_header")
    algorithm = keys.Hmac(digest=options["algorithm"],
                          size=keys.HMAC_DIGESTS[options["algorithm"]])
    version = ENTRY_VERSION if options.get("entries") else "hmac"
    scheme = SignedContent(
        headers=(HeaderSet(signature=options["signature_header"],
                           timestamp=options.get("timestamp_header"),
                           id=id_header if "{id}" in options["content"] else None),),
        format=(Entries(separator=",", pair="=", timestamp="t", trim=True)
                if options.get("entries") else Single(prefix=options.get("prefix", ""),
                                                     version=version)),
        encoding=options["encoding"], algorithms={version: algorithm},
        content=Template(options["content"]), needs_url="{url}" in options["content"],
        timestamp_format=options.get("timestamp_format", "unix"))
    event_id: Field = Header(id_header) if id_header else BodyPath.of(options["id_path"])
    event_type: Field = (Header(options["type_header"]) if "type_header" in options
                         else BodyPath.of("type"))
    return SenderProfile(name="hmac", scheme=scheme, event_id=event_id, event_type=event_type,
                         id_is_signed=not id_header or "{id}" in options["content"],
                         body_format=options.get("body_format", JSON),
                         success_body=options.get("success_body"))
