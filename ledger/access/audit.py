"""Append-only, hash-chained audit log of every administrative action."""

from __future__ import annotations

import getpass
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select, text

from ledger.db.schema import audit_log

GENESIS = "0" * 64
# Any constant works; it only has to be the same in every process.
AUDIT_LOCK_KEY = 0x4C454447  # "LEDG"


@dataclass(frozen=True, slots=True, kw_only=True)
class Actor:
    """Who performs an action: an operator (role from the dashboard) or a CLI user."""

    name: str
    role: str
    request_id: str | None = None

    @classmethod
    def cli(cls) -> Actor:
        """Return the actor for a command run from a shell."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return cls(name=f"cli:{user}", role="cli", request_id=None)


def _row_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    """Hash a row's content together with its predecessor's hash."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{prev_hash}\n{canonical}".encode()).hexdigest()


def _fields(row: Any) -> dict[str, Any]:
    """Return the hashed content of an audit row (mapping or Row)."""
    m = row if isinstance(row, dict) else row._mapping
    return {k: (m[k].isoformat() if isinstance(m[k], datetime) else m[k])
            for k in ("at", "actor", "role", "action", "target", "scope", "reason",
                      "request_id", "detail")}


def record(conn: Connection, actor: Actor, action: str, target: str, *, at: datetime,
           scope: str | None = None, reason: str | None = None,
           detail: dict[str, Any] | None = None) -> int:
    """Append one audit row in the caller's transaction and return its id."""
    if conn.dialect.name == "postgresql":
        # Serialise appenders so that two transactions never chain to the same row.
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": AUDIT_LOCK_KEY})
    prev = conn.execute(
        select(audit_log.c.row_hash).order_by(audit_log.c.id.desc()).limit(1)
    ).scalar()
    # Hash what the database gives back: UTC (a +02:00 instant would read back as UTC).
    at = at.astimezone(UTC)
    values = {
        "at": at, "actor": actor.name, "role": actor.role, "action": action,
        "target": target, "scope": scope, "reason": reason, "request_id": actor.request_id,
        "detail": json.dumps(detail, sort_keys=True) if detail else None,
    }
    prev_hash = prev or GENESIS
    row_hash = _row_hash(prev_hash, _fields(values))
    result = conn.execute(
        insert(audit_log).values(**values, prev_hash=prev_hash, row_hash=row_hash)
        .returning(audit_log.c.id)
    )
    return int(result.scalar_one())


def verify_chain(conn: Connection, batch: int = 5000) -> dict[str, Any]:
    """Walk the chain in id order; report the first row whose links do not hold."""
    total = int(conn.execute(select(func.count()).select_from(audit_log)).scalar_one())
    expected_prev = GENESIS
    last_id = 0
    while True:
        chunk = conn.execute(
            select(audit_log).where(audit_log.c.id > last_id)
            .order_by(audit_log.c.id).limit(batch)
        ).all()
        if not chunk:
            return {"ok": True, "rows": total, "first_bad": None}
        for row in chunk:
            if row.prev_hash != expected_prev or row.row_hash != _row_hash(
                row.prev_hash, _fields(row)
            ):
                return {"ok": False, "rows": total, "first_bad": row.id}
            expected_prev = row.row_hash
            last_id = row.id
