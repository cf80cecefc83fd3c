"""Server-side dashboard sessions and the login rate limit, shared by every process."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, func, insert, select, text, update
from sqlalchemy.exc import OperationalError

from ledger.access.operators import Operator, get_operator_by_id
from ledger.db.schema import login_failures, operator_sessions

# Writing last_seen_at on every page view would turn reads into writes; a
# minute of slack on a 30-minute idle timeout is harmless.
TOUCH_SECONDS = 60
# First key of the two-key PostgreSQL advisory lock that serializes login attempts of one
# rate-limit key (the second is hashtext(key)); the one-key space is the scheduler's.
LOGIN_LOCK_CLASS = 0x4C4F47  # "LOG"
# PostgreSQL's SQLSTATE for a lock wait that ran past lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"
# What a sign-in refused for contention (LoginBusy) tells the client to wait.
BUSY_RETRY_SECONDS = 2


class LoginBusy(Exception):
    """Other sign-ins of the same rate-limit key held its lock past the lock timeout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPolicy:
    """How long a session lives without use, and at most."""

    idle_seconds: float
    absolute_seconds: float


def _digest(session_id: str) -> bytes:
    """Return the stored form of a session id."""
    return hashlib.sha256(session_id.encode()).digest()


def start_session(conn: Connection, operator: Operator, now: datetime) -> str:
    """Open a new session for the operator and return its random id (the cookie value)."""
    session_id = secrets.token_urlsafe(32)
    conn.execute(insert(operator_sessions).values(
        id_sha256=_digest(session_id), operator_id=operator.id, created_at=now,
        last_seen_at=now))
    return session_id


def load_session(conn: Connection, session_id: str, now: datetime,
                 policy: SessionPolicy) -> Operator | None:
    """Return the session's operator, or None when it ended, idled out or grew too old."""
    row = conn.execute(
        select(operator_sessions).where(operator_sessions.c.id_sha256 == _digest(session_id))
    ).first()
    if row is None or row.ended_at is not None:
        return None
    idle = now - row.last_seen_at > timedelta(seconds=policy.idle_seconds)
    too_old = now - row.created_at > timedelta(seconds=policy.absolute_seconds)
    if idle or too_old:
        end_session(conn, session_id, now)
        return None
    operator = get_operator_by_id(conn, row.operator_id)
    if operator is None:
        return None
    if now - row.last_seen_at > timedelta(seconds=TOUCH_SECONDS):
        conn.execute(update(operator_sessions)
                     .where(operator_sessions.c.id_sha256 == row.id_sha256)
                     .values(last_seen_at=now))
    return operator


def end_session(conn: Connection, session_id: str, now: datetime) -> None:
    """End a session (logout, timeout)."""
    conn.execute(update(operator_sessions)
                 .where(operator_sessions.c.id_sha256 == _digest(session_id),
                        operator_sessions.c.ended_at.is_(None))
                 .values(ended_at=now))


def login_key(username: str, address: str) -> str:
    """Return the rate-limit key of a login attempt: the username and the client address."""
    return f"{username.strip().lower()[:64]}|{address}"


# Failures of one username from every address together may reach this many times the
# per-address limit: rotating addresses (or a proxy count set wrong) buys an attacker
# only that many more guesses, while one noisy address cannot lock the operator out.
USERNAME_LIMIT_FACTOR = 4


def username_key(username: str) -> str:
    """Return the rate-limit key of a username from any address."""
    return f"{username.strip().lower()[:64]}|*"


def reserve_login(conn: Connection, username: str, address: str, now: datetime,
                  window_seconds: float, max_failures: int) -> int:
    """Reserve a login attempt against both limits; return the seconds to wait (0: go on).

    Per (username, address) at `max_failures`, and per username from any address at
    USERNAME_LIMIT_FACTOR times that; the keys are always locked in this order.
    """
    for key, limit in ((login_key(username, address), max_failures),
                       (username_key(username), max_failures * USERNAME_LIMIT_FACTOR)):
        wait = reserve_login_attempt(conn, key, now, window_seconds, limit)
        if wait:
            return wait
    return 0


def clear_login(conn: Connection, username: str, address: str) -> None:
    """Forget both limits' failures of this username after it signed in."""
    clear_failures(conn, login_key(username, address))
    clear_failures(conn, username_key(username))


def recent_failures(conn: Connection, key: str, now: datetime, window_seconds: float) -> int:
    """Count failed logins for the key within the window."""
    since = now - timedelta(seconds=window_seconds)
    return int(conn.execute(
        select(func.count()).select_from(login_failures)
        .where(login_failures.c.key == key, login_failures.c.at > since)
    ).scalar_one())


def retry_after(conn: Connection, key: str, now: datetime, window_seconds: float,
                max_failures: int) -> int:
    """Return seconds until the key may try again (0 when it may now)."""
    since = now - timedelta(seconds=window_seconds)
    times = conn.execute(
        select(login_failures.c.at).where(login_failures.c.key == key,
                                          login_failures.c.at > since)
        .order_by(login_failures.c.at.desc()).limit(max_failures)
    ).scalars().all()
    if len(times) < max_failures:
        return 0
    # The oldest of the last `max_failures` failures must leave the window.
    oldest = times[-1]
    return max(1, int((oldest + timedelta(seconds=window_seconds) - now).total_seconds()) + 1)


def record_failure(conn: Connection, key: str, now: datetime, window_seconds: float) -> None:
    """Remember one failed login and forget this key's failures older than the window."""
    conn.execute(delete(login_failures).where(
        login_failures.c.key == key,
        login_failures.c.at <= now - timedelta(seconds=window_seconds)))
    conn.execute(insert(login_failures).values(key=key, at=now))


def reserve_login_attempt(conn: Connection, key: str, now: datetime, window_seconds: float,
                          max_failures: int) -> int:
    """Check the limit and count this attempt as a failure in one atomic step.

    Returns 0 when the attempt may go on (it counts as failed until `clear_failures`
    proves otherwise), else the seconds to wait. Checking first and recording after the
    slow password check let parallel guesses all pass the check (16 evaluated against a
    limit of 5); here each attempt takes its slot before any password is looked at.
    SQLite serializes the whole transaction (BEGIN IMMEDIATE); PostgreSQL takes a
    transaction-scoped advisory lock on the key, and raises LoginBusy when that lock
    stays taken past lock_timeout: only sign-ins of this very key hold it, so the wait
    means a burst on one key, answered as a rate limit, not as storage trouble.
    """
    if conn.dialect.name == "postgresql":
        _lock_login_key(conn, key)
    wait = retry_after(conn, key, now, window_seconds, max_failures)
    if not wait:
        record_failure(conn, key, now, window_seconds)
    return wait


def _lock_login_key(conn: Connection, key: str) -> None:
    """Take the key's advisory lock for the transaction, or raise LoginBusy.

    After a lock timeout the transaction is aborted: LoginBusy must leave it (rollback).
    """
    try:
        conn.execute(text("SELECT pg_advisory_xact_lock(:cls, hashtext(:key))"),
                     {"cls": LOGIN_LOCK_CLASS, "key": key})
    except OperationalError as error:
        if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        raise LoginBusy(key) from error


def clear_failures(conn: Connection, key: str) -> None:
    """Forget the key's failures after a successful login."""
    conn.execute(delete(login_failures).where(login_failures.c.key == key))


def reserve_reentry(conn: Connection, session_id: str, max_failures: int) -> bool:
    """Take a password re-entry slot of this session; False once it used up its tries.

    Only this session's own wrong re-entries count, never login failures made
    elsewhere: an attacker guessing at the login form cannot stop a logged-in operator
    from confirming a revocation. The conditional UPDATE is atomic on both databases.
    """
    return conn.execute(
        update(operator_sessions)
        .where(operator_sessions.c.id_sha256 == _digest(session_id),
               operator_sessions.c.ended_at.is_(None),
               operator_sessions.c.reauth_failures < max_failures)
        .values(reauth_failures=operator_sessions.c.reauth_failures + 1)
    ).rowcount == 1


def settle_reentry(conn: Connection, session_id: str, ok: bool, now: datetime,
                   max_failures: int) -> bool:
    """Settle a reserved re-entry: reset on success; end the session at the limit.

    Returns True when the session ended (too many wrong passwords in it).
    """
    where = operator_sessions.c.id_sha256 == _digest(session_id)
    if ok:
        conn.execute(update(operator_sessions).where(where).values(reauth_failures=0))
        return False
    failures = conn.execute(select(operator_sessions.c.reauth_failures).where(where)
                            ).scalar_one_or_none()
    if failures is not None and failures >= max_failures:
        end_session(conn, session_id, now)
        return True
    return False
