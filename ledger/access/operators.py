"""Operator accounts of the dashboard: roles, argon2 password hashes and API tokens."""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from ledger.access import audit
from ledger.db.schema import api_tokens, operator_sessions, operators
from ledger.errors import NotFound, Refused

# Each role includes every power of the roles before it.
ROLES = ("viewer", "oncall", "security", "admin")
USERNAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")  # fullmatch: no trailing newline
MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024
TOKEN_PREFIX = "rlt_"
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


def issue_token(conn: Connection, actor: audit.Actor, username: str, *,
                now: datetime) -> str:
    """Create an API token for the operator; audited. The token is returned once."""
    target = get_operator(conn, username)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = conn.execute(
        insert(api_tokens).values(operator_id=target.id, token_sha256=token_digest(token),
                                  created_at=now).returning(api_tokens.c.id)
    ).scalar_one()
    audit.record(conn, actor, "operator.token", username, at=now,
                 detail={"token_id": token_id})
    return token


def revoke_tokens(conn: Connection, actor: audit.Actor, username: str, *, reason: str,
                  now: datetime) -> int:
    """Revoke every live API token of the operator; audited. Returns how many."""
    target = get_operator(conn, username)
    count = conn.execute(
        update(api_tokens).where(api_tokens.c.operator_id == target.id,
                                 api_tokens.c.revoked_at.is_(None)).values(revoked_at=now)
    ).rowcount
    audit.record(conn, actor, "operator.token_revoke", username, at=now, reason=reason,
                 detail={"revoked": count})
    return int(count)


def operator_for_token(conn: Connection, token: str, now: datetime) -> Operator | None:
    """Return the operator owning a live API token, or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = conn.execute(
        select(operators.c.id, operators.c.username, operators.c.role,
               api_tokens.c.id.label("token_id"), api_tokens.c.last_used_at)
        .join(api_tokens, api_tokens.c.operator_id == operators.c.id)
        .where(api_tokens.c.token_sha256 == token_digest(token),
               api_tokens.c.revoked_at.is_(None), operators.c.disabled_at.is_(None))
    ).first()
    if row is None:
        return None
    if row.last_used_at is None or now - row.last_used_at > timedelta(
            seconds=TOKEN_TOUCH_SECONDS):
        conn.execute(update(api_tokens).where(api_tokens.c.id == row.token_id)
                     .values(last_used_at=now))
    return Operator.from_row(row)
