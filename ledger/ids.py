"""Public identifiers: prefix + 22 base62 characters from the OS CSPRNG.

Check them with `fullmatch`: with `match`, `$` would let a trailing newline through.
"""

from __future__ import annotations

import re
import secrets

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
INTEGRATION_ID = re.compile(r"in_[0-9A-Za-z]{22}")
KEY_ID = re.compile(r"key_[0-9A-Za-z]{22}")
TOKEN_ID = re.compile(r"tok_[0-9A-Za-z]{22}")
SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


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
