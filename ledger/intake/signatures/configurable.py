"""The `hmac` profile: an operator describes a sender without a preset.

Options (stored per integration as JSON, set by `ledger integration create
--profile hmac …`; README, "The hmac profile"):

| option | meaning | default |
|---|---|---|
| `signature_header` | header holding the signature | required |
| `algorithm` | `sha256`, `sha1` or `sha512` | `sha256` |
| `encoding` | `hex` (lowercase) or `base64` | `hex` |
| `prefix` | text before the signature (`sha256=`) | none |
| `content` | signed-content template over `{body}`, `{timestamp}`, `{id}` | `{body}` |
| `timestamp_header` | header with unix seconds; freshness is then checked | none |
| `id_header` / `id_path` | where the event id is: a header, or a dotted body path | one required |
| `type_header` | header naming the type (else `--type-path`, `--event-type`, body `type`) | none |

An id in a header that the template does not sign (`{id}`) is unsigned: the
body-digest guard applies, as for GitHub.
"""

from __future__ import annotations

import json
from typing import Any

from ledger.intake.signatures import keys
from ledger.intake.signatures.fields import BodyPath, Field, Header
from ledger.intake.signatures.profile import SenderProfile
from ledger.intake.signatures.schemes import HeaderSet, SignedContent, Single, Template

HEADER_NAME = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
OPTION_NAMES = ("signature_header", "algorithm", "encoding", "prefix", "content",
                "timestamp_header", "id_header", "id_path", "type_header")


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


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Return the options normalised, or raise ValueError saying what is wrong."""
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise ValueError(f"unknown hmac options: {sorted(unknown)}")
    found = {"signature_header": header_option(options, "signature_header", required=True),
             "timestamp_header": header_option(options, "timestamp_header"),
             "id_header": header_option(options, "id_header"),
             "type_header": header_option(options, "type_header")}
    found["algorithm"] = options.get("algorithm") or "sha256"
    if found["algorithm"] not in keys.HMAC_DIGESTS:
        raise ValueError(f"algorithm must be one of {sorted(keys.HMAC_DIGESTS)}")
    found["encoding"] = options.get("encoding") or "hex"
    if found["encoding"] not in ("hex", "base64"):
        raise ValueError("encoding must be hex or base64")
    found["prefix"] = options.get("prefix") or ""
    found["content"] = options.get("content") or "{body}"
    for text in (found["prefix"], found["content"]):
        if not isinstance(text, str) or not text.isascii() or not text.isprintable():
            raise ValueError("prefix and signed content must be printable ASCII")
    used = Template(str(found["content"])).placeholders
    if "{body}" not in used:
        raise ValueError("the signed content must contain {body}")
    if ("{timestamp}" in used) != bool(found["timestamp_header"]):
        raise ValueError("a timestamp header and {timestamp} in the signed content go together")
    if "{id}" in used and not found["id_header"]:
        raise ValueError("{id} in the signed content needs id-header")
    found["id_path"] = options.get("id_path") or None
    if bool(found["id_header"]) == bool(found["id_path"]):
        raise ValueError("give exactly one of id-header and id-path")
    return {name: value for name, value in found.items() if value}


def hmac_profile(options_json: str) -> SenderProfile:
    """Build the `hmac` profile an integration's stored options describe."""
    options = check_options(json.loads(options_json))
    timestamp = options.get("timestamp_header")
    id_header = options.get("id_header")
    algorithm = keys.Hmac(digest=options["algorithm"],
                          size=keys.HMAC_DIGESTS[options["algorithm"]])
    scheme = SignedContent(
        headers=(HeaderSet(signature=options["signature_header"], timestamp=timestamp,
                           id=id_header if "{id}" in options["content"] else None),),
        format=Single(prefix=options.get("prefix", ""), version="hmac"),
        encoding=options["encoding"], algorithms={"hmac": algorithm},
        content=Template(options["content"]))
    event_id: Field = Header(id_header) if id_header else BodyPath.of(options["id_path"])
    event_type: Field = (Header(options["type_header"]) if "type_header" in options
                         else BodyPath.of("type"))
    return SenderProfile(name="hmac", scheme=scheme, event_id=event_id, event_type=event_type,
                         id_is_signed=not id_header or "{id}" in options["content"])
