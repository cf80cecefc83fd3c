"""Drop what outlives the review window: failed payloads and kept conflict bodies.

A failed work item keeps its payload for LEDGER_REVIEW_WINDOW_SECONDS so an operator
can inspect and requeue it; a conflict keeps the incoming body as long. Past that
the payload (and the raw body) and the incoming body are set to NULL, batch by
batch; the receipt, its counts and its digests stay until retention. The forensic
window's original bodies (conflict_bodies) go when their own time is up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, select, tuple_, update

from ledger.config import Settings
from ledger.db.schema import conflict_bodies, conflicts, jobs
from ledger.domain import JobStatus
from ledger.metrics import PURGED_ROWS

from .retention_batching import delete_expired, run_batch


def count_expired_payloads(conn: Connection, review_cutoff: datetime) -> int:
    """Count failed work items still holding a payload accepted before `review_cutoff`."""
    return int(conn.execute(
        select(func.count()).select_from(jobs).where(*_payload_due(review_cutoff))
    ).scalar_one())


def _payload_due(review_cutoff: datetime) -> tuple[Any, ...]:
    """Return the predicate of failed work items whose payload outlived the review window."""
    return (jobs.c.status == JobStatus.FAILED.value, jobs.c.payload.is_not(None),
            jobs.c.accepted_at < review_cutoff)


def expire_payloads(engine: Engine, settings: Settings, review_cutoff: datetime,
                    batch_size: int) -> int:
    """Set payload = NULL on failed work items past the review window, batch by batch."""
    total = 0
    while True:
        picked = (select(jobs.c.scope_id, jobs.c.event_id)
                  .where(*_payload_due(review_cutoff)).limit(batch_size))
        stmt = (update(jobs)
                .where(tuple_(jobs.c.scope_id, jobs.c.event_id).in_(picked),
                       *_payload_due(review_cutoff))
                .values(payload=None, raw_body=None))

        def step(conn: Connection, stmt: Any = stmt) -> int:
            return conn.execute(stmt).rowcount

        count = run_batch(engine, settings, step)
        total += count
        PURGED_ROWS.labels("payloads").inc(count)
        if count < batch_size:
            return total


def expire_conflict_bodies(engine: Engine, settings: Settings, review_cutoff: datetime,
                           batch_size: int) -> int:
    """Drop conflicting bodies kept past the review window (the count and digests stay)."""
    total = 0
    due = (conflicts.c.incoming_body.is_not(None), conflicts.c.first_seen < review_cutoff)
    while True:
        picked = select(conflicts.c.id).where(*due).limit(batch_size)
        stmt = update(conflicts).where(conflicts.c.id.in_(picked), *due).values(
            incoming_body=None)

        def step(conn: Connection, stmt: Any = stmt) -> int:
            return conn.execute(stmt).rowcount

        count = run_batch(engine, settings, step)
        total += count
        PURGED_ROWS.labels("conflict_bodies").inc(count)
        if count < batch_size:
            return total


def drop_expired_forensic_bodies(engine: Engine, now: datetime, batch_size: int) -> int:
    """Delete the forensic window's bodies whose time is up, batch by batch; return how many."""
    return delete_expired(engine, conflict_bodies, ("scope_id", "event_id"), now, batch_size)
