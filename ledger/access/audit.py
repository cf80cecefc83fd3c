"""Append-only audit log of every administrative action, chained by HMAC-SHA256.

Each row's `row_hash` is an HMAC, keyed by LEDGER_AUDIT_KEY, over the row and
its predecessor's hash: someone who can write to the database but does not
hold the key cannot edit a row and recompute the chain so that it verifies.
Rows written before the chain was keyed carry a plain SHA-256 (`legacy`);
they may only form the start of the log, the first keyed row after them
commits to their head, and they verify only once `ledger audit rechain` sealed
them, once, on the operator's word or an anchored head: a database writer who
rewrites the whole log unkeyed gets it neither sealed nor verified
(docs/how-to/audit-anchor.md).
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, text

from ledger.config import AUDIT_KEY_FILE, Settings, development_key
from ledger.db.schema import audit_log
from ledger.errors import LedgerError, Refused, TooLong
from ledger.logs import get_logger

GENESIS = "0" * 64
# Any constant works; it only has to be the same in every process.
AUDIT_LOCK_KEY = 0x4C454447  # "LEDG"
KEYED_PREFIX = "hmac-sha256:"
# The one row that vouches for unkeyed rows: written by `ledger audit rechain`, always keyed.
SEAL_ACTION = "audit.rechain"
# Reasons and notes land in a log nobody can delete: keep them to a few sentences.
MAX_REASON_LENGTH = 500
# The key travels with the engine (an execution option), so every transaction that
# appends to the log chains with it without each caller passing it along.
KEY_OPTION = "ledger_audit_key"


class AuditKeyError(LedgerError):
    """The audit key is missing where the chain needs it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Actor:
    """Who performs an action: an operator (role from the dashboard) or a CLI user."""

    name: str
    role: str
    request_id: str | None = None
    # The operator's address (dashboard and API): kept in the row's detail, so hashed.
    client: str | None = None

    @classmethod
    def cli(cls) -> Actor:
        """Return the actor for a command run from a shell."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return cls(name=f"cli:{user}", role="cli", request_id=None)


def load_audit_key(settings: Settings) -> bytes:
    """Return LEDGER_AUDIT_KEY; outside production, generate one into var/ with a warning."""
    if settings.audit_key:
        return settings.audit_key.encode()
    if settings.production:
        raise AuditKeyError("LEDGER_AUDIT_KEY must be set in production")
    created = not (Path(settings.var_dir) / AUDIT_KEY_FILE).exists()
    key = development_key(settings.var_dir, AUDIT_KEY_FILE, lambda: secrets.token_urlsafe(32))
    if created:  # warn when generated, not on every command that reads it
        get_logger("ledger.audit").warning("audit_key.development",
                                           path=str(Path(settings.var_dir) / AUDIT_KEY_FILE),
                                           hint="set LEDGER_AUDIT_KEY outside development")
    if not key:
        raise AuditKeyError(f"{Path(settings.var_dir) / AUDIT_KEY_FILE} is empty; delete it "
                            "or set LEDGER_AUDIT_KEY")
    return key.encode()


def keyed(engine: Engine, key: bytes) -> Engine:
    """Return the engine (same pool) whose connections chain audit rows with `key`."""
    return engine.execution_options(**{KEY_OPTION: key})


def key_of(conn: Connection) -> bytes:
    """Return the audit key bound to this connection's engine."""
    key = conn.get_execution_options().get(KEY_OPTION)
    if not key:
        raise AuditKeyError("this engine carries no audit key (build it with audit.keyed)")
    return bytes(key)


def _canonical(prev_hash: str, fields: dict[str, Any]) -> bytes:
    """Return the bytes a row's hash covers: its predecessor's hash and its content."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return f"{prev_hash}\n{canonical}".encode()


def _row_hash(prev_hash: str, fields: dict[str, Any], key: bytes) -> str:
    """HMAC a row's content together with its predecessor's hash."""
    return KEYED_PREFIX + hmac.new(key, _canonical(prev_hash, fields), "sha256").hexdigest()


def _legacy_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    """The plain SHA-256 of rows written before the chain was keyed."""
    return hashlib.sha256(_canonical(prev_hash, fields)).hexdigest()


def _fields(row: Any) -> dict[str, Any]:
    """Return the hashed content of an audit row (mapping or Row)."""
    m = row if isinstance(row, dict) else row._mapping
    return {k: (m[k].isoformat() if isinstance(m[k], datetime) else m[k])
            for k in ("at", "actor", "role", "action", "target", "scope", "reason",
                      "request_id", "detail")}


def check_reason(reason: str | None, what: str = "reason") -> None:
    """Refuse a reason or note longer than MAX_REASON_LENGTH (TooLong)."""
    if reason is not None and len(reason) > MAX_REASON_LENGTH:
        raise TooLong(what, MAX_REASON_LENGTH)


def record(conn: Connection, actor: Actor, action: str, target: str, *, at: datetime,
           scope: str | None = None, reason: str | None = None,
           detail: dict[str, Any] | None = None) -> int:
    """Append one audit row in the caller's transaction and return its id."""
    check_reason(reason)
    key = key_of(conn)
    if conn.dialect.name == "postgresql":
        # Serialise appenders so that two transactions never chain to the same row.
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": AUDIT_LOCK_KEY})
    prev = conn.execute(
        select(audit_log.c.row_hash).order_by(audit_log.c.id.desc()).limit(1)
    ).scalar()
    # Hash what the database gives back: UTC (a +02:00 instant would read back as UTC).
    at = at.astimezone(UTC)
    if actor.client:
        detail = {**(detail or {}), "client": actor.client}
    values = {
        "at": at, "actor": actor.name, "role": actor.role, "action": action,
        "target": target, "scope": scope, "reason": reason, "request_id": actor.request_id,
        "detail": json.dumps(detail, sort_keys=True) if detail else None,
    }
    prev_hash = prev or GENESIS
    row_hash = _row_hash(prev_hash, _fields(values), key)
    result = conn.execute(
        insert(audit_log).values(**values, prev_hash=prev_hash, row_hash=row_hash)
        .returning(audit_log.c.id)
    )
    return int(result.scalar_one())


def _rows(conn: Connection, batch: int) -> Any:
    """Yield every audit row in id order, a batch at a time."""
    last_id = 0
    while True:
        chunk = conn.execute(select(audit_log).where(audit_log.c.id > last_id)
                             .order_by(audit_log.c.id).limit(batch)).all()
        if not chunk:
            return
        yield from chunk
        last_id = chunk[-1].id


@dataclass(frozen=True, slots=True, kw_only=True)
class _Walk:
    """What walking the chain found."""

    first_bad: int | None
    first_id: int | None
    legacy_rows: int
    legacy_head: Any  # the last unkeyed row (they may only open the log)
    sealed: bool  # an `audit.rechain` row names that head
    head: Any  # the last row, when the chain holds


def _seals(row: Any, legacy_head: Any) -> bool:
    """Tell whether a keyed row is the rechain seal naming this unkeyed head."""
    if row.action != SEAL_ACTION or legacy_head is None:
        return False
    named = json.loads(row.detail or "{}").get("legacy_head")
    return bool(named == {"id": legacy_head.id, "hash": legacy_head.row_hash})


def _walk(conn: Connection, key: bytes, batch: int) -> _Walk:
    """Check every link in id order; stop at the first row that does not hold."""
    expected_prev, legacy, keyed_seen, sealed = GENESIS, 0, False, False
    first_id, head, legacy_head = None, None, None
    for row in _rows(conn, batch):
        first_id = row.id if first_id is None else first_id
        if row.row_hash.startswith(KEYED_PREFIX):
            good = row.row_hash == _row_hash(row.prev_hash, _fields(row), key)
            sealed = sealed or (good and _seals(row, legacy_head))
            keyed_seen = True
        else:
            # Unkeyed rows may only open the log (none may follow a keyed one), and a
            # seal is always keyed: an unkeyed `audit.rechain` is a forgery.
            good = (not keyed_seen and row.action != SEAL_ACTION
                    and row.row_hash == _legacy_hash(row.prev_hash, _fields(row)))
            legacy, legacy_head = legacy + 1, row
        if row.prev_hash != expected_prev or not good:
            return _Walk(first_bad=row.id, first_id=first_id, legacy_rows=legacy,
                         legacy_head=None, sealed=False, head=None)
        expected_prev, head = row.row_hash, row
    return _Walk(first_bad=None, first_id=first_id, legacy_rows=legacy,
                 legacy_head=legacy_head, sealed=sealed, head=head)


def parse_anchor(text: str) -> tuple[int, str]:
    """Parse an anchored head `ID:HASH` (as `ledger audit head` prints it); ValueError if not."""
    raw_id, _, digest = text.partition(":")
    if not raw_id.isdigit() or not digest.startswith(KEYED_PREFIX):
        raise ValueError("an anchored head is ID:HASH, the hash starting with "
                         f"{KEYED_PREFIX!r} (as `ledger audit head` prints them)")
    return int(raw_id), digest


def _anchor_holds(conn: Connection, anchor: tuple[int, str]) -> bool:
    """Tell whether the anchored row is still in the log with the anchored keyed hash."""
    found = conn.execute(select(audit_log.c.row_hash)
                         .where(audit_log.c.id == anchor[0])).scalar()
    return found == anchor[1]


def check_chain(conn: Connection, anchor: tuple[int, str] | None = None,
                batch: int = 5000) -> tuple[dict[str, Any], str | None]:
    """Return verify's answer and, when it is not ok, why (for people, not for JSON).

    Unkeyed rows verify only once sealed by `ledger audit rechain`: an ordinary row
    chaining onto them does not vouch for them, or a database writer could rewrite the
    whole log unkeyed and wait for the next action to bless it.
    """
    total = int(conn.execute(select(func.count()).select_from(audit_log)).scalar_one())
    walk = _walk(conn, key_of(conn), batch)
    if walk.first_bad is not None:
        return {"ok": False, "rows": total, "first_bad": walk.first_bad}, "broken"
    if anchor is not None and not _anchor_holds(conn, anchor):
        return {"ok": False, "rows": total, "first_bad": anchor[0]}, "anchor"
    if walk.legacy_rows and not walk.sealed:
        return {"ok": False, "rows": total, "first_bad": walk.first_id}, "unsealed"
    return {"ok": True, "rows": total, "first_bad": None}, None


def verify_chain(conn: Connection, batch: int = 5000) -> dict[str, Any]:
    """Walk the chain in id order; report the first row whose links do not hold.

    A log that opens with unkeyed rows does not verify until they are sealed: anyone
    could have rewritten them (`ledger audit rechain`).
    """
    return check_chain(conn, batch=batch)[0]


# Rows one dashboard or API request verifies: the chain grows with the log forever, a
# request must not (a bulk requeue alone audits a row per receipt).
VERIFY_CHUNK = 2000


def verify_chunk(conn: Connection, after: int = 0, limit: int | None = None
                 ) -> dict[str, Any]:
    """Verify at most `limit` rows (VERIFY_CHUNK) after row `after`, linked to the stored
    hash of the row before them.

    Answers verify's keys and `next`: the row to continue after, or None when the walk
    reached the end or a bad row. `ok` is None while rows remain; walked from `after=0`
    to the end, the chunks give the whole-chain verdict of `verify_chain`. The link is
    the last row at or before `after` (GENESIS before the first), so a row deleted at a
    chunk's edge breaks the next row's link as it would in one walk.
    """
    limit = limit or VERIFY_CHUNK
    total = int(conn.execute(select(func.count()).select_from(audit_log)).scalar_one())
    prev = conn.execute(select(audit_log).where(audit_log.c.id <= after)
                        .order_by(audit_log.c.id.desc()).limit(1)).first()
    first_id = conn.execute(select(func.min(audit_log.c.id))).scalar()
    keyed_seen = prev is not None and prev.row_hash.startswith(KEYED_PREFIX)
    legacy_head, sealed = _legacy_before(conn, prev) if prev is not None else (None, False)
    expected_prev = prev.row_hash if prev is not None else GENESIS
    key, last = key_of(conn), None
    rows = conn.execute(select(audit_log).where(audit_log.c.id > after)
                        .order_by(audit_log.c.id).limit(limit)).all()
    for row in rows:
        if row.row_hash.startswith(KEYED_PREFIX):
            good = row.row_hash == _row_hash(row.prev_hash, _fields(row), key)
            sealed = sealed or (good and _seals(row, legacy_head))
            keyed_seen = True
        else:  # as in _walk: unkeyed rows only open the log, and never as a seal
            good = (not keyed_seen and row.action != SEAL_ACTION
                    and row.row_hash == _legacy_hash(row.prev_hash, _fields(row)))
            legacy_head = row
        if row.prev_hash != expected_prev or not good:
            return {"ok": False, "rows": total, "first_bad": row.id, "next": None}
        expected_prev, last = row.row_hash, row.id
    if len(rows) == limit:
        return {"ok": None, "rows": total, "first_bad": None, "next": last}
    if legacy_head is not None and not sealed:
        return {"ok": False, "rows": total, "first_bad": first_id, "next": None}
    return {"ok": True, "rows": total, "first_bad": None, "next": None}


def _legacy_before(conn: Connection, prev: Any) -> tuple[Any, bool]:
    """Return the unkeyed rows' head at or before `prev` and whether a seal after it names it.

    Rows up to `prev` verified in earlier chunks, so unkeyed rows are a prefix of them: a
    keyed `prev` after a keyed first row means none (two key lookups, the usual log).
    """
    if not prev.row_hash.startswith(KEYED_PREFIX):
        return prev, False
    first = conn.execute(select(audit_log.c.row_hash).order_by(audit_log.c.id)
                         .limit(1)).scalar()
    if first is None or first.startswith(KEYED_PREFIX):
        return None, False
    legacy_head = conn.execute(
        select(audit_log).where(audit_log.c.id <= prev.id,
                                ~audit_log.c.row_hash.startswith(KEYED_PREFIX))
        .order_by(audit_log.c.id.desc()).limit(1)).first()
    if legacy_head is None:  # the first row went since the last chunk: nothing to seal
        return None, False
    seals = conn.execute(select(audit_log).where(
        audit_log.c.action == SEAL_ACTION, audit_log.c.id > legacy_head.id,
        audit_log.c.id <= prev.id)).all()
    return legacy_head, any(_seals(row, legacy_head) for row in seals)


def head(conn: Connection) -> dict[str, Any]:
    """Return the newest row's id and hash, to be anchored outside the database."""
    row = conn.execute(select(audit_log.c.id, audit_log.c.at, audit_log.c.row_hash)
                       .order_by(audit_log.c.id.desc()).limit(1)).first()
    if row is None:
        return {"id": None, "hash": None, "at": None}
    return {"id": row.id, "hash": row.row_hash, "at": row.at.astimezone(UTC).isoformat()}


NEEDS_BASIS = ("{n} audit rows were never keyed. Seal them only if this deployment never "
               "ran with LEDGER_AUDIT_KEY (--never-keyed), or give an anchored head "
               "(--head ID:HASH). If it ever ran keyed, the log was rewritten: do not seal it.")


def rechain(conn: Connection, actor: Actor, *, at: datetime, fingerprints: int = 0,
            never_keyed: bool = False, anchor: tuple[int, str] | None = None,
            batch: int = 5000) -> dict[str, Any]:
    """Seal the unkeyed rows that open the log, once, with one recorded row.

    Refuses a broken chain, an anchored head that is gone, and unkeyed rows without
    the operator's word that they were never keyed (or an anchor that vouches for them).
    """
    walk = _walk(conn, key_of(conn), batch)
    if walk.first_bad is not None:
        raise Refused(f"the audit chain is broken at row {walk.first_bad}; "
                      "re-chaining would hide that")
    if anchor is not None and not _anchor_holds(conn, anchor):
        raise Refused(f"the anchored head (row {anchor[0]}) is not in the log as anchored: "
                      "the log was rewritten; nothing was sealed")
    sealed = walk.legacy_rows if walk.legacy_rows and not walk.sealed else 0
    if sealed and not never_keyed and anchor is None:
        raise Refused(NEEDS_BASIS.format(n=sealed))
    if not sealed and not fingerprints:
        return {"rechained": 0, "fingerprints": 0, "audit_id": None}
    detail: dict[str, Any] = {"legacy_rows": sealed, "fingerprints": fingerprints}
    if sealed:
        detail["legacy_head"] = {"id": walk.legacy_head.id, "hash": walk.legacy_head.row_hash}
        detail["started_from"] = {"id": walk.head.id, "hash": walk.head.row_hash}
        detail["basis"] = "anchor" if anchor is not None else "never-keyed"
    audit_id = record(conn, actor, SEAL_ACTION, "audit_log", at=at, detail=detail)
    return {"rechained": sealed, "fingerprints": fingerprints, "audit_id": audit_id}
