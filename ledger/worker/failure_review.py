"""Operators reviewing a failure group: acknowledge it, mute it, or clear that (audited)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Connection, delete

from ledger.access import audit
from ledger.db.engine import conflict_insert
from ledger.db.schema import failure_groups
from ledger.errors import Refused
from ledger.worker.failure_groups import group_id


class GroupState(StrEnum):
    """An operator's verdict on a failure group; the stored `failure_groups.state`."""

    ACKNOWLEDGED = "acknowledged"  # seen and being handled: still listed, marked
    MUTED = "muted"  # known and accepted: listed apart, below the others


def review_group(conn: Connection, actor: audit.Actor, *, event_type: str, signature: str,
                 state: GroupState | None, note: str, now: datetime) -> str:
    """Set (or with state None clear) a group's verdict with a note; audited. Return its id."""
    note = (note or "").strip()
    if not note:
        raise Refused("a note is required to acknowledge, mute or unmute a failure group")
    audit.check_reason(note, "note")
    gid = group_id(event_type, signature)
    if state is None:
        conn.execute(delete(failure_groups).where(failure_groups.c.id == gid))
    else:
        values = {"state": state.value, "note": note, "updated_by": actor.name,
                  "updated_at": now}
        conn.execute(conflict_insert(conn, failure_groups)
                     .values(id=gid, event_type=event_type, signature=signature, **values)
                     .on_conflict_do_update(index_elements=["id"], set_=values))
    action = f"failure_group.{state.value if state else 'cleared'}"
    audit.record(conn, actor, action, f"group:{gid}", at=now, reason=note,
                 detail={"event_type": event_type, "signature": signature})
    return gid
