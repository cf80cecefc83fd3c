"""Operator accounts of the dashboard: roles, argon2 password hashes and API tokens."""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Connection, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from ledger.access import audit
from ledger.db.schema import api_tokens, operator_sessions, operators
from ledger.errors import LedgerError, NotFound, Refused
from ledger.ids import new_token_id

# Each role includes every power of the roles before it.
ROLES = ("viewer", "oncall", "security", "admin")
USERNAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")  # fullmatch: no trailing newline
MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024
TOKEN_PREFIX = "rlt_"
TOKEN_SCOPES = ("read", "write")
DEFAULT_TOKEN_SECONDS = 90 * 86400
MIN_TOKEN_SECONDS = 1
MAX_TOKEN_SECONDS = 365 * 86400
# Touching last_used_at on every API call would make each read a write.
TOKEN_TOUCH_SECONDS = 60

_hasher = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """Return a hash to verify against, so an unknown username is as slow as a wrong password.

    Made on first use, not at import: an Argon2 hash costs ~0.3 s of CPU, which
    every web worker would otherwise pay at each start and recycle.
    """
    return _hasher.hash(secrets.token_urlsafe(16))


@dataclass(frozen=True, slots=True, kw_only=True)
class Operator:
    """A dashboard user as the server sees it on each request."""

    id: int
    username: str
    role: str
    # None for a browser session; the scopes of the API token that authenticated otherwise.
    token_scopes: tuple[str, ...] | None = None
    # The API token's row and the primary's WAL position after its last write (tokens only).
    token_row: int | None = None
    token_wrote_at: str | None = None

    def can(self, needed: str) -> bool:
        """Tell whether this operator's role includes `needed`."""
        return role_rank(self.role) >= role_rank(needed)

    @classmethod
    def from_row(cls, row: Any) -> Operator:
        """Build from a row of the operators table."""
        return cls(id=row.id, username=row.username, role=row.role)


def role_rank(role: str) -> int:
    """Return the rank of a role (viewer 0 … admin 3); unknown roles rank below viewer."""
    return ROLES.index(role) if role in ROLES else -1


def _check(username: str, role: str, password: str) -> None:
    """Refuse usernames, roles and passwords nobody should have."""
    if not USERNAME.fullmatch(username):
        raise Refused("username must match [a-z0-9][a-z0-9._-]{0,62}")
    if role not in ROLES:
        raise Refused(f"role must be one of {', '.join(ROLES)}")
    if not MIN_PASSWORD_LENGTH <= len(password) <= MAX_PASSWORD_LENGTH:
        raise Refused(f"password must be {MIN_PASSWORD_LENGTH}-{MAX_PASSWORD_LENGTH} characters")


def create_operator(conn: Connection, actor: audit.Actor, *, username: str, role: str,
                    password: str, now: datetime) -> Operator:
    """Create an operator with an argon2 password hash; audited."""
    _check(username, role, password)
    try:
        with conn.begin_nested():
            new_id = conn.execute(
                insert(operators).values(username=username, role=role,
                                         password_hash=_hasher.hash(password), created_at=now)
                .returning(operators.c.id)
            ).scalar_one()
    except IntegrityError:
        raise Refused(f"operator {username!r} already exists") from None
    audit.record(conn, actor, "operator.create", username, at=now, detail={"role": role})
    return Operator(id=new_id, username=username, role=role)


def get_operator(conn: Connection, username: str) -> Operator:
    """Return the enabled operator with this username, or raise NotFound."""
    row = conn.execute(
        select(operators).where(operators.c.username == username,
                                operators.c.disabled_at.is_(None))
    ).first()
    if row is None:
        raise NotFound("operator", username)
    return Operator.from_row(row)


def get_operator_by_id(conn: Connection, operator_id: int) -> Operator | None:
    """Return the enabled operator with this id, or None."""
    row = conn.execute(
        select(operators).where(operators.c.id == operator_id,
                                operators.c.disabled_at.is_(None))
    ).first()
    return None if row is None else Operator.from_row(row)


def password_hash_of(conn: Connection, username: str) -> tuple[Operator | None, str]:
    """Return the enabled operator and its hash, or (None, a dummy hash) to verify against."""
    row = conn.execute(
        select(operators).where(operators.c.username == username,
                                operators.c.disabled_at.is_(None))
    ).first()
    if row is None or not row.password_hash:
        return None, _dummy_hash()
    return Operator.from_row(row), row.password_hash


# Each Argon2 check takes 64 MiB and ~0.3 s of CPU: at most this many run at once in a
# process, so a flood of sign-ins with random usernames cannot grow a web worker without
# bound. A sign-in that finds every slot taken for HASH_WAIT_SECONDS is refused at once.
MAX_CONCURRENT_HASHES = 2
HASH_WAIT_SECONDS = 0.5
_hash_slots = threading.BoundedSemaphore(MAX_CONCURRENT_HASHES)


class HashingBusy(LedgerError):
    """Every password-hashing slot of this process stayed taken: try again shortly."""


def verify_login_password(stored_hash: str, password: str) -> bool:
    """Check a sign-in's password within the process's hashing slots, or raise HashingBusy.

    Only the login form goes through the slots: a logged-in operator re-entering the
    password to revoke a key must never wait behind an attacker's flood.
    """
    if not _hash_slots.acquire(timeout=HASH_WAIT_SECONDS):
        raise HashingBusy("too many sign-ins are being checked")
    try:
        return verify_password(stored_hash, password)
    finally:
        _hash_slots.release()


def verify_password(stored_hash: str, password: str) -> bool:
    """Check a password against an argon2 hash (slow on purpose: call outside transactions)."""
    try:
        return bool(_hasher.verify(stored_hash, password))
    except (VerificationError, InvalidHashError):
        return False


def list_operators(conn: Connection) -> list[dict[str, Any]]:
    """Return every operator (a short list) for the admin page."""
    rows = conn.execute(
        select(operators.c.id, operators.c.username, operators.c.role,
               operators.c.created_at, operators.c.disabled_at).order_by(operators.c.username)
    ).all()
    return [dict(r._mapping) for r in rows]


def set_role(conn: Connection, actor: audit.Actor, username: str, role: str, *,
             reason: str, now: datetime) -> None:
    """Change an operator's role and end their sessions; audited."""
    if role not in ROLES:
        raise Refused(f"role must be one of {', '.join(ROLES)}")
    target = get_operator(conn, username)
    conn.execute(update(operators).where(operators.c.id == target.id).values(role=role))
    _end_sessions(conn, target.id, now)
    audit.record(conn, actor, "operator.role", username, at=now, reason=reason,
                 detail={"from": target.role, "to": role})


def disable_operator(conn: Connection, actor: audit.Actor, username: str, *, reason: str,
                     now: datetime) -> None:
    """Disable an operator: sessions end and API tokens stop working; audited."""
    target = get_operator(conn, username)
    if target.username == actor.name:
        raise Refused("you cannot disable your own account")
    conn.execute(update(operators).where(operators.c.id == target.id).values(disabled_at=now))
    _end_sessions(conn, target.id, now)
    conn.execute(update(api_tokens).where(api_tokens.c.operator_id == target.id,
                                          api_tokens.c.revoked_at.is_(None))
                 .values(revoked_at=now))
    audit.record(conn, actor, "operator.disable", username, at=now, reason=reason)


def _end_sessions(conn: Connection, operator_id: int, now: datetime) -> None:
    """End every open session of an operator."""
    conn.execute(update(operator_sessions)
                 .where(operator_sessions.c.operator_id == operator_id,
                        operator_sessions.c.ended_at.is_(None))
                 .values(ended_at=now))


def token_digest(token: str) -> bytes:
    """Return the stored form of an API token (sha256: tokens are long random strings)."""
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedToken:
    """A new API token: the secret value is here once and stored only as a hash."""

    token_id: str
    token: str
    scopes: tuple[str, ...]
    expires_at: datetime


def _scopes(stored: str) -> tuple[str, ...]:
    """Return the scopes of a stored token, in TOKEN_SCOPES order."""
    given = set(stored.split())
    return tuple(s for s in TOKEN_SCOPES if s in given)


def issue_token(conn: Connection, actor: audit.Actor, username: str, *, now: datetime,
                write: bool = False,
                expires_in: int = DEFAULT_TOKEN_SECONDS) -> IssuedToken:
    """Create an API token for the operator (read-only unless `write`); audited."""
    if not MIN_TOKEN_SECONDS <= expires_in <= MAX_TOKEN_SECONDS:
        raise Refused(f"a token expires in {MIN_TOKEN_SECONDS}-{MAX_TOKEN_SECONDS} seconds")
    target = get_operator(conn, username)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    scopes = ("read", "write") if write else ("read",)
    issued = IssuedToken(token_id=new_token_id(), token=token, scopes=scopes,
                         expires_at=now + timedelta(seconds=expires_in))
    conn.execute(insert(api_tokens).values(
        operator_id=target.id, token_sha256=token_digest(token), created_at=now,
        public_id=issued.token_id, scopes=" ".join(scopes), expires_at=issued.expires_at))
    audit.record(conn, actor, "operator.token", username, at=now,
                 detail={"token_id": issued.token_id, "scopes": list(scopes),
                         "expires_at": issued.expires_at.isoformat()})
    return issued


def list_tokens(conn: Connection, username: str | None = None) -> list[dict[str, Any]]:
    """Return the tokens of one operator (or of all), newest first; never a token value."""
    query = (select(operators.c.username, api_tokens.c.public_id.label("token_id"),
                    api_tokens.c.scopes, api_tokens.c.created_at, api_tokens.c.expires_at,
                    api_tokens.c.last_used_at, api_tokens.c.revoked_at)
             .join(operators, operators.c.id == api_tokens.c.operator_id)
             .order_by(api_tokens.c.created_at.desc(), api_tokens.c.id.desc()))
    if username is not None:
        query = query.where(operators.c.id == get_operator(conn, username).id)
    return [{**dict(row._mapping), "scopes": list(_scopes(row.scopes))}
            for row in conn.execute(query).all()]


def revoke_token(conn: Connection, actor: audit.Actor, token_id: str, *,
                 now: datetime) -> datetime:
    """Revoke one API token by its public id; audited. Returns when it was revoked."""
    row = conn.execute(
        select(api_tokens.c.id, api_tokens.c.revoked_at, operators.c.username)
        .join(operators, operators.c.id == api_tokens.c.operator_id)
        .where(api_tokens.c.public_id == token_id)
    ).first()
    if row is None:
        raise NotFound("token", token_id)
    if row.revoked_at is not None:
        raise Refused(f"token {token_id} was already revoked at {row.revoked_at.isoformat()}")
    conn.execute(update(api_tokens).where(api_tokens.c.id == row.id).values(revoked_at=now))
    audit.record(conn, actor, "operator.token_revoke", row.username, at=now,
                 detail={"token_id": token_id})
    return now


def operator_for_token(conn: Connection, token: str, now: datetime) -> Operator | None:
    """Return the operator owning a live, unexpired API token (with its scopes), or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = conn.execute(
        select(operators.c.id, operators.c.username, operators.c.role,
               api_tokens.c.id.label("token_row"), api_tokens.c.scopes,
               api_tokens.c.expires_at, api_tokens.c.last_used_at, api_tokens.c.wrote_at)
        .join(api_tokens, api_tokens.c.operator_id == operators.c.id)
        .where(api_tokens.c.token_sha256 == token_digest(token),
               api_tokens.c.revoked_at.is_(None), operators.c.disabled_at.is_(None))
    ).first()
    if row is None or row.expires_at <= now:
        return None
    stale = now - timedelta(seconds=TOKEN_TOUCH_SECONDS)
    if row.last_used_at is None or row.last_used_at < stale:
        # Conditional, so processes that race here write the row once, not each.
        conn.execute(update(api_tokens)
                     .where(api_tokens.c.id == row.token_row,
                            or_(api_tokens.c.last_used_at.is_(None),
                                api_tokens.c.last_used_at < stale))
                     .values(last_used_at=now))
    return Operator(id=row.id, username=row.username, role=row.role,
                    token_scopes=_scopes(row.scopes), token_row=row.token_row,
                    token_wrote_at=row.wrote_at)


def note_token_write(conn: Connection, token_row: int, position: str) -> None:
    """Remember the primary's WAL position after a write made with this API token."""
    conn.execute(update(api_tokens).where(api_tokens.c.id == token_row)
                 .values(wrote_at=position))
