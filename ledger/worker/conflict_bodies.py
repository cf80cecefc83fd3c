"""The forensic window: keep a completed receipt's original body apart from its job.

A job's payload leaves the ledger when the job completes, usually milliseconds after the
delivery, so a later delivery of the same event id with another body had nothing to be
compared with. With LEDGER_CONFLICT_BODY_SECONDS > 0 the worker copies the body into
`conflict_bodies` in the completing transaction; the retention purge drops expired rows.
Off by default: it costs one row (the body's size) per completed receipt for the window.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, insert

from ledger.db.schema import conflict_bodies
from ledger.worker.store import WorkItem


def keep_original_bodies(conn: Connection, done: Iterable[WorkItem], *, now: datetime,
                         seconds: float) -> None:
    """Keep the bodies of jobs completing in this transaction for `seconds` (0: nothing)."""
    if seconds <= 0:
        return
    rows = [{"scope_id": job.scope_id, "event_id": job.event_id, "body": job.payload,
             "kept_at": now, "expires_at": now + timedelta(seconds=seconds)}
            for job in done if job.payload is not None]
    if not rows:
        return
    for row in rows:  # a receipt run again completes again: its newest body is kept
        conn.execute(delete(conflict_bodies).where(
            conflict_bodies.c.scope_id == row["scope_id"],
            conflict_bodies.c.event_id == row["event_id"]))
    conn.execute(insert(conflict_bodies), rows)
