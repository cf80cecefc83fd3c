"""Drop the ledger's bookkeeping older than retention.

Scheduler run records, resolved findings, conflicts whose original receipt is
gone, the members of old bulk requeues and senders' used signature tokens: none is
a receipt, and each would otherwise grow without end.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine, delete, select

from ledger.config import Settings
from ledger.db.schema import (
    conflicts,
    findings,
    receipts,
    requeue_members,
    scheduler_runs,
    sender_tokens,
)
from ledger.metrics import PURGED_ROWS

from . import retention_scoped as scoped
from .retention_batching import delete_expired, run_batch


def expire_bookkeeping(engine: Engine, settings: Settings, cutoff: datetime, *,
                       scoped_conflicts: bool = False) -> None:
    """Drop run records, resolved findings and orphaned conflicts older than retention.

    With `scoped_conflicts` (a distributed ledger) the conflicts go scope by scope.
    """
    orphan = ~select(receipts.c.scope_id).where(
        receipts.c.scope_id == conflicts.c.scope_id,
        receipts.c.event_id == conflicts.c.original_event_id).exists()
    statements = {
        "scheduler_runs": delete(scheduler_runs).where(scheduler_runs.c.started_at < cutoff),
        "findings": delete(findings).where(findings.c.resolved_at < cutoff),
        # A replayed-body conflict names a fresh event id that never had a receipt:
        # it expires with the original it pointed at.
        "conflicts": delete(conflicts).where(conflicts.c.last_seen < cutoff, orphan),
    }
    if scoped_conflicts:
        del statements["conflicts"]
    for kind, stmt in statements.items():
        def step(conn: Connection, stmt: Any = stmt) -> int:
            return conn.execute(stmt).rowcount

        PURGED_ROWS.labels(kind).inc(max(run_batch(engine, settings, step), 0))
    if scoped_conflicts:
        with engine.connect() as conn:
            scopes = scoped.orphan_scopes(conn, cutoff)
        for scope in scopes:
            PURGED_ROWS.labels("conflicts").inc(run_batch(engine, settings, partial(
                scoped.scope_orphans, scope=scope, cutoff=cutoff)))


def drop_old_requeue_members(engine: Engine, cutoff: datetime) -> int:
    """Forget the bulk requeues older than the retention (their receipts are gone too)."""
    with engine.begin() as conn:
        return int(conn.execute(delete(requeue_members)
                                .where(requeue_members.c.requeued_at < cutoff)).rowcount)


def drop_expired_sender_tokens(engine: Engine, now: datetime, batch_size: int) -> int:
    """Forget the senders' signature tokens whose signed timestamp has left the freshness
    window (a signature that old is refused as stale anyway); return how many."""
    return delete_expired(engine, sender_tokens, ("scope_id", "token"), now, batch_size)
