"""Expire finished receipts with attempts, failed work item, unsigned-body record, conflicts.

A receipt is deleted only when it is `complete` or `failed` and was accepted
more than LEDGER_RETENTION_SECONDS ago; a pending receipt is never touched.
Its failed work item, its unsigned-body record and its conflicts go in the same
batch transaction; its attempts go in that batch too, or (PostgreSQL, the bulk of
them) just before it by their own time, so a replay after expiry finds nothing
and becomes new work. A failed receipt an operator requeues while a purge runs
keeps its attempts (they stay while it has a work item); a receipt run again
("Run again", ledger/worker/rerun.py) after its retention loses its earlier
completed attempts on PostgreSQL.

Nothing references receipts with a foreign key, so a batch costs no per-row FK
check (several times the delete). On PostgreSQL a batch is a window of heap pages
(retention_windows.py); on SQLite a LIMITed batch of rowids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from functools import partial
from itertools import repeat
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, text

from ledger.config import CLOCK_SKEW_SECONDS, Settings
from ledger.db.schema import UTCDateTime, attempts, conflicts, jobs, receipts, unsigned_bodies
from ledger.domain import ReceiptState
from ledger.metrics import PURGED_ROWS
from ledger.worker.failure_groups import forget_members, remove_failures

from .retention_batching import Pacer, run_batch
from .retention_windows import page_windows, tid_bounds

FINISHED = (ReceiptState.COMPLETE.code, ReceiptState.FAILED.code)
# How far apart the intake's and the workers' clocks may be: an attempt is never
# stamped more than this before its receipt's accepted_at (NTP keeps hosts far closer).
# The same allowance is part of the default retention (ledger.config).
CLOCK_SKEW = timedelta(seconds=CLOCK_SKEW_SECONDS)

# Attempts go first, by their own time: one started before `:before` belongs to a
# receipt accepted before the cutoff (CLOCK_SKEW covers hosts' clocks), which this purge
# deletes unless it is unfinished. An unfinished receipt (pending or failed) is exactly
# one with a work item (a `jobs` row), so an attempt stays while its receipt has a work
# item: a pending receipt keeps its history, and a failed one keeps it for the receipts
# pass below, which deletes it with its receipt under the receipt's row lock. (A failed
# receipt requeued between the two passes keeps its history too; the check on the
# receipt's state that this replaces deleted it.) An attempt whose outcome is 'complete'
# needs no lookup: it completed its receipt and deleted its work item in the same
# transaction (only "Run again" gives a completed receipt a work item again; past the
# retention its earlier completed attempts then go, as before). The others probe the
# work item's primary key: the jobs table holds only unfinished work, so its key stays
# small enough to stay in shared_buffers at any ledger size, where the receipts' key
# (730 MB at 10M receipts) would be read into them for most probes. (A `NOT IN (pending
# receipts)` set is hashed only while it fits in work_mem; past that PostgreSQL rescans
# the whole set for every row: 37 s per window at 10M.)
_PG_ATTEMPTS_WINDOW = text("""
DELETE FROM attempts a
WHERE a.ctid >= CAST(:lo AS tid) AND a.ctid < CAST(:hi AS tid) AND a.started_at < :before
  AND (a.outcome = 'complete' OR NOT EXISTS (
        SELECT 1 FROM jobs j WHERE j.scope_id = a.scope_id AND j.event_id = a.event_id))
""").bindparams(bindparam("before", type_=UTCDateTime))

# Receipts, statement 1 of a batch: lock the window's expired receipts that still
# have dependants, delete those dependants and the receipts. After the attempts
# pass that is a failed receipt (attempts, work item), one finished after `:late`
# (attempts), or one with a conflict or an unsigned-body record: about 1 % of the
# window. FOR UPDATE keeps a held receipt as it is until the batch commits (a
# requeue waits), so its dependants and the receipt go together or not at all.
_PG_HOLD = text("""
WITH held AS MATERIALIZED (
    SELECT r.ctid, r.scope_id, r.event_id, r.state, r.body_sha256 FROM receipts r
    WHERE r.ctid >= CAST(:lo AS tid) AND r.ctid < CAST(:hi AS tid)
      AND r.accepted_at < :cutoff AND r.state IN (1, 2)
      AND (r.state = 2 OR r.completed_at IS NULL OR r.completed_at >= :late
           OR EXISTS (SELECT 1 FROM conflicts c
                      WHERE c.scope_id = r.scope_id AND c.event_id = r.event_id)
           OR EXISTS (SELECT 1 FROM unsigned_bodies u
                      WHERE u.scope_id = r.scope_id AND u.body_sha256 = r.body_sha256))
    FOR UPDATE OF r
), gone_receipts AS (
    DELETE FROM receipts r USING held h WHERE r.ctid = h.ctid RETURNING 1
), gone_attempts AS (
    DELETE FROM attempts a USING held h
    WHERE a.scope_id = h.scope_id AND a.event_id = h.event_id RETURNING 1
), gone_jobs AS (
    DELETE FROM jobs j USING held h
    WHERE h.state = 2 AND j.scope_id = h.scope_id AND j.event_id = h.event_id RETURNING 1
), gone_bodies AS (
    DELETE FROM unsigned_bodies u USING held h
    WHERE u.scope_id = h.scope_id AND u.body_sha256 = h.body_sha256
      AND u.event_id = h.event_id RETURNING 1
), gone_conflicts AS (
    DELETE FROM conflicts c USING held h
    WHERE c.scope_id = h.scope_id AND c.event_id = h.event_id RETURNING 1
), gone_members AS (
    DELETE FROM failure_members m USING held h
    WHERE h.state = 2 AND m.scope_id = h.scope_id AND m.event_id = h.event_id
    RETURNING m.group_id, m.scope_id
)
SELECT (SELECT count(*) FROM gone_receipts) AS receipts,
       (SELECT count(*) FROM gone_attempts) AS attempts,
       (SELECT count(*) FROM gone_jobs) AS jobs,
       (SELECT count(*) FROM gone_bodies) AS unsigned_bodies,
       (SELECT count(*) FROM gone_conflicts) AS conflicts,
       (SELECT json_agg(json_build_array(group_id, scope_id)) FROM gone_members) AS members
""").bindparams(bindparam("cutoff", type_=UTCDateTime), bindparam("late", type_=UTCDateTime))

# Receipts, statement 2: the rest of the window's expired receipts, complete before
# `:late` with nothing attached when statement 1 looked, deleted without RETURNING
# (which cost ~0.5 us a row: a refetch plus a tuplestore row). A receipt that
# finished after statement 1 looked (it was pending then) has completed_at >= :late,
# so it stays for the next purge instead of leaving its attempts behind.
_PG_DELETE_WINDOW = text("""
DELETE FROM receipts
WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid)
  AND accepted_at < :cutoff AND state = 1 AND completed_at < :late
""").bindparams(bindparam("cutoff", type_=UTCDateTime), bindparam("late", type_=UTCDateTime))

# The probes above join a few held rows to big tables by index; the planner,
# misjudging how few, would hash all of `attempts` instead. JIT compilation of
# these plans would cost more than a batch.
_PG_PROBE_SETTINGS = ("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; "
                      "SET LOCAL jit = off")

# Attempts rows are never locked by the intake, and an attempts batch may hash the
# unfinished work items' keys once (when they fit in work_mem), so its windows are larger.
ATTEMPTS_WINDOW_FACTOR = 4

_SQLITE_BATCH = text("""
DELETE FROM receipts
WHERE rowid IN (SELECT rowid FROM receipts
                WHERE accepted_at < :cutoff AND state IN (1, 2) LIMIT :batch)
RETURNING scope_id, event_id, body_sha256
""").bindparams(bindparam("cutoff", type_=UTCDateTime))


def count_expired(conn: Connection, cutoff: datetime) -> int:
    """Count finished receipts accepted before `cutoff`."""
    return int(conn.execute(
        select(func.count()).select_from(receipts)
        .where(receipts.c.accepted_at < cutoff, receipts.c.state.in_(FINISHED))
    ).scalar_one())


def expire_attempts_by_time(engine: Engine, settings: Settings, cutoff: datetime,
                            batch_size: int, pacer: Pacer | None = None) -> int:
    """PostgreSQL: delete attempts older than the cutoff (less skew) but unfinished work's."""
    if engine.dialect.name != "postgresql":
        return 0
    params: dict[str, Any] = {"before": cutoff - CLOCK_SKEW}
    total = 0
    for lo, hi in page_windows(engine, "attempts", batch_size * ATTEMPTS_WINDOW_FACTOR,
                                "started_at < :before", params):
        def step(conn: Connection, lo: int = lo, hi: int = hi) -> int:
            conn.exec_driver_sql("SET LOCAL jit = off")
            return conn.execute(_PG_ATTEMPTS_WINDOW, {**params, **tid_bounds(lo, hi)}).rowcount

        deleted = run_batch(engine, settings, step, pacer)
        total += deleted
        PURGED_ROWS.labels("attempts").inc(deleted)
    return total


def expire_receipts(engine: Engine, settings: Settings, cutoff: datetime, batch_size: int,
                    on_batch: Callable[[int], None] | None = None,
                    pacer: Pacer | None = None) -> int:
    """Delete finished receipts before `cutoff` with their dependants, one batch per commit."""
    total = 0
    if engine.dialect.name == "postgresql":
        # A receipt finished before `late` has no attempt left after expire_attempts_by_time.
        params = {"cutoff": cutoff, "late": cutoff - 2 * CLOCK_SKEW}
        batches: Iterator[Callable[[Connection], dict[str, int]]] = (
            partial(_pg_batch, params={**params, **tid_bounds(lo, hi)})
            for lo, hi in page_windows(engine, "receipts", batch_size,
                                        "accepted_at < :cutoff AND state IN (1, 2)", params))
    else:
        batches = repeat(partial(_sqlite_batch, cutoff=cutoff, batch_size=batch_size))
    for step in batches:
        counts = run_batch(engine, settings, step, pacer)
        for kind, count in counts.items():
            PURGED_ROWS.labels(kind).inc(count)
        total += counts["receipts"]
        if on_batch is not None:
            on_batch(total)
        if engine.dialect.name != "postgresql" and counts["receipts"] < batch_size:
            return total
    return total


def _pg_batch(conn: Connection, params: dict[str, Any]) -> dict[str, int]:
    """Delete one page window of receipts: dependants of the held ones, then the receipts."""
    conn.exec_driver_sql(_PG_PROBE_SETTINGS)
    held = dict(conn.execute(_PG_HOLD, params).one()._mapping)
    # A purged failure leaves its failure group (ledger.worker.failure_groups).
    forget_members(conn, [(gid, int(sid)) for gid, sid in held.pop("members") or ()])
    counts = {kind: int(n) for kind, n in held.items()}
    counts["receipts"] += conn.execute(_PG_DELETE_WINDOW, params).rowcount
    return counts


def _sqlite_batch(conn: Connection, cutoff: datetime, batch_size: int) -> dict[str, int]:
    """Delete one batch on SQLite: receipts first, then their dependants by key."""
    doomed = conn.execute(_SQLITE_BATCH, {"cutoff": cutoff, "batch": batch_size}).all()
    counts = {"receipts": len(doomed), "attempts": 0, "jobs": 0, "unsigned_bodies": 0,
              "conflicts": 0}
    if not doomed:
        return counts
    keys = [{"s": r.scope_id, "e": r.event_id, "d": r.body_sha256} for r in doomed]
    by_key = {
        "attempts": delete(attempts).where(attempts.c.scope_id == bindparam("s"),
                                           attempts.c.event_id == bindparam("e")),
        "jobs": delete(jobs).where(jobs.c.scope_id == bindparam("s"),
                                   jobs.c.event_id == bindparam("e")),
        "unsigned_bodies": delete(unsigned_bodies).where(
            unsigned_bodies.c.scope_id == bindparam("s"),
            unsigned_bodies.c.body_sha256 == bindparam("d"),
            unsigned_bodies.c.event_id == bindparam("e")),
        "conflicts": delete(conflicts).where(conflicts.c.scope_id == bindparam("s"),
                                             conflicts.c.event_id == bindparam("e")),
    }
    for kind, stmt in by_key.items():
        counts[kind] = max(conn.execute(stmt, keys).rowcount, 0)
    remove_failures(conn, [(r.scope_id, r.event_id) for r in doomed])
    return counts
