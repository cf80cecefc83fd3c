"""Operators acknowledging conflicts (same id with another body, replayed bodies)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select, update

from ledger.access import audit
from ledger.access.integrations import get_integration_by_id
from ledger.db.schema import conflicts
from ledger.errors import NotFound, Refused


def acknowledge_conflict(conn: Connection, actor: audit.Actor, conflict_id: int, *,
                         note: str, now: datetime) -> None:
    """Mark a conflict as reviewed with a note; audited. Refused when already acknowledged."""
    note = (note or "").strip()
    if not note:
        raise Refused("a note is required to acknowledge a conflict")
    audit.check_reason(note, "note")
    row = conn.execute(select(conflicts).where(conflicts.c.id == conflict_id)).first()
    if row is None:
        raise NotFound("conflict", str(conflict_id))
    changed = conn.execute(
        update(conflicts).where(conflicts.c.id == conflict_id,
                                conflicts.c.acknowledged_at.is_(None))
        .values(acknowledged_at=now, acknowledged_by=actor.name, ack_note=note)).rowcount
    if changed != 1:
        raise Refused(f"conflict {conflict_id} is already acknowledged")
    scope = get_integration_by_id(conn, row.scope_id).scope
    audit.record(conn, actor, "conflict.acknowledge", f"{scope}:{row.event_id}", at=now,
                 scope=scope, reason=note,
                 detail={"conflict_id": conflict_id, "kind": row.kind})
