"""The `token` profile: a sender that authenticates with a shared secret sent as-is.

Options (stored per integration as JSON, set by `ledger integration create
--profile token …`; docs/senders/token.md):

| option | meaning |
|---|---|
| `token_header` / `token_query` / `basic` | where the token is (exactly one); Basic: the |
| | secret is the whole `user:password` |
| `id_header` / `id_path` | where the event id is; neither: the body-digest id |
| `type_header` | header naming the type (else `--type-path`, `--event-type`, body `type`) |
| `allow_plaintext` | accept the token over plain HTTP in production |
"""

from __future__ import annotations

import json
import secrets as random
from typing import Any

from ledger.intake.signatures.configurable import header_option
from ledger.intake.signatures.fields import BodyDigestId, BodyPath, Field, Header
from ledger.intake.signatures.profile import RAW_SECRET, SecretFormat, SenderProfile, printable
from ledger.intake.signatures.shared_token import SharedToken

TOKEN = "token"
OPTION_NAMES = ("token_header", "token_query", "basic", "id_header", "id_path", "type_header",
                "allow_plaintext")
QUERY_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _basic_secret(secret: str) -> str | None:
    """A Basic-auth credential is the whole `user:password` pair."""
    return printable(secret) or (None if ":" in secret[1:] else "secret must be user:password")


BASIC_SECRET = SecretFormat(generate=lambda: "ledger:" + random.token_urlsafe(32),
                            check=_basic_secret)


def check_token_options(options: dict[str, Any]) -> dict[str, Any]:
    """Return the options normalised, or raise ValueError saying what is wrong."""
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise ValueError(f"unknown token options: {sorted(unknown)}")
    found: dict[str, Any] = {name: header_option(options, name)
                             for name in ("token_header", "id_header", "type_header")}
    query = options.get("token_query") or None
    if query is not None and (not isinstance(query, str) or not 0 < len(query) <= 100
                              or not set(query) <= QUERY_NAME_CHARS):
        raise ValueError("token-query must be a query parameter name of letters, digits, -_.")
    found["token_query"] = query
    found["basic"] = bool(options.get("basic"))
    if sum(map(bool, (found["token_header"], query, found["basic"]))) != 1:
        raise ValueError("the token profile needs exactly one of token-header, token-query "
                         "and basic")
    found["id_path"] = options.get("id_path") or None
    if found["id_header"] and found["id_path"]:
        raise ValueError("give at most one of id-header and id-path")
    found["allow_plaintext"] = bool(options.get("allow_plaintext"))
    return {name: value for name, value in found.items() if value}


def token_profile(options_json: str) -> SenderProfile:
    """Build the `token` profile an integration's stored options describe."""
    options = check_token_options(json.loads(options_json))
    scheme = SharedToken(header=options.get("token_header"), query=options.get("token_query"),
                         basic=bool(options.get("basic")),
                         allow_plaintext=bool(options.get("allow_plaintext")))
    event_id: Field = (Header(options["id_header"]) if "id_header" in options
                       else BodyPath.of(options["id_path"]) if "id_path" in options
                       else BodyDigestId())
    event_type: Field = (Header(options["type_header"]) if "type_header" in options
                         else BodyPath.of("type"))
    return SenderProfile(name=TOKEN, scheme=scheme, event_id=event_id, event_type=event_type,
                         id_is_signed=False,
                         secret=BASIC_SECRET if options.get("basic") else RAW_SECRET)
