r"""Identifier formats: public ids (prefix + 22 base62 characters from the OS CSPRNG), slugs,
and the sender's event id and event type.

Every pattern matches the whole string: the public ids and slugs are anchored at both ends
(`^…\Z`, so `match` and `fullmatch` alike check all of it; a `$` would let a trailing newline
through); the event patterns are written as CONTRACT.md states them and used with `fullmatch`.
"""

from __future__ import annotations

import re
import secrets

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
INTEGRATION_ID = re.compile(r"^in_[0-9A-Za-z]{22}\Z")
KEY_ID = re.compile(r"^key_[0-9A-Za-z]{22}\Z")
TOKEN_ID = re.compile(r"^tok_[0-9A-Za-z]{22}\Z")
DESTINATION_ID = re.compile(r"^dst_[0-9A-Za-z]{22}\Z")
SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")
EVENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,254}")
EVENT_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")
# A DNS host name (LEDGER_DESTINATION_ALLOW, destination URLs): labels of letters, digits
# and '-', dot-separated, an optional final dot; matched lowercase, used with `fullmatch`.
HOST_NAME = re.compile(r"(?=.{1,253}\.?\Z)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*"
                       r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.?")


def random_base62(length: int) -> str:
    """Return `length` uniformly random base62 characters."""
    return "".join(secrets.choice(BASE62) for _ in range(length))


def new_integration_id() -> str:
    """Return a fresh public integration id (`in_…`)."""
    return "in_" + random_base62(22)


def new_key_id() -> str:
    """Return a fresh credential key id (`key_…`)."""
    return "key_" + random_base62(22)


def new_token_id() -> str:
    """Return a fresh public API token id (`tok_…`)."""
    return "tok_" + random_base62(22)


def new_destination_id() -> str:
    """Return a fresh public destination id (`dst_…`)."""
    return "dst_" + random_base62(22)
