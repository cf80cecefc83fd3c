"""Retention: expire finished receipts past the retention window, drop reviewed payloads.

A receipt is deleted only when it is `complete` or `failed` and was accepted
more than LEDGER_RETENTION_SECONDS ago; a pending receipt is never touched.
Its failed job, its unsigned-body record and its conflicts go in the same batch
transaction; its attempts go in that batch too, or (PostgreSQL, the bulk of
them) just before it by their own time, so a replay after expiry finds nothing
and becomes new work (the seed's stated consequence, README "Operations:
scheduled jobs"). A failed receipt an operator requeues while a purge runs may
lose the attempts older than the cutoff; the receipt itself stays.

Every batch is its own short transaction with `lock_timeout` set: intake keeps
committing between and during batches, and nothing references receipts with a
foreign key, so a batch costs no per-row FK check (MEASUREMENTS.md: ~7x).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, text, tuple_, update
from sqlalchemy import exc as sa_exc

from ledger import audit
from ledger.clock import Clock
from ledger.config import Settings
from ledger.domain import JobStatus, ReceiptState
from ledger.logs import get_logger
from ledger.metrics import PURGED_ROWS
from ledger.schema import (
    UTCDateTime,
    attempts,
    conflicts,
    findings,
    jobs,
    receipts,
    scheduler_runs,
    unsigned_bodies,
)

log = get_logger("ledger.jobs.retention")
DEFAULT_BATCH_SIZE = 25_000
FINISHED = (ReceiptState.COMPLETE.code, ReceiptState.FAILED.code)
LOCK_RETRIES = 3
# How far apart the intake's and the workers' clocks may be: an attempt is never
# stamped more than this before its receipt's accepted_at (NTP keeps hosts far closer).
CLOCK_SKEW = timedelta(minutes=5)
# Share of wall time the purge may spend in batches: after a batch that took t
# seconds it sleeps t * (1 / duty - 1), leaving the rest of the CPU to intake
# (bench/README.md "Retention purge": rows/s vs intake during the purge).
DEFAULT_DUTY_CYCLE = 0.5

# PostgreSQL: one statement per batch. The inner SELECT walks the BRIN index on
# accepted_at; `ctid = ANY(ARRAY(...))` is a TID scan, and the outer predicate is
# re-checked in case a row changed (an operator requeue) after it was picked.
# Attempts started before `:late` are already gone (`_PG_ATTEMPTS_BY_TIME`), so
# only a receipt that finished after it (or failed) is probed for attempts; only
# a failed receipt can still have a job (a completed job's row is deleted).
_PG_BATCH = text("""
WITH doomed AS (
    DELETE FROM receipts
    WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM receipts
            WHERE accepted_at < :cutoff AND state IN (1, 2)
            LIMIT :batch))
      AND accepted_at < :cutoff AND state IN (1, 2)
    RETURNING scope_id, event_id, body_sha256, state, completed_at
), gone_attempts AS (
    DELETE FROM attempts a USING doomed d
    WHERE (d.state = 2 OR d.completed_at IS NULL OR d.completed_at >= :late)
      AND a.scope_id = d.scope_id AND a.event_id = d.event_id RETURNING 1
), gone_jobs AS (
    DELETE FROM jobs j USING doomed d
    WHERE d.state = 2 AND j.scope_id = d.scope_id AND j.event_id = d.event_id RETURNING 1
), gone_bodies AS (
    DELETE FROM unsigned_bodies u USING doomed d
    WHERE u.scope_id = d.scope_id AND u.body_sha256 = d.body_sha256
      AND u.event_id = d.event_id RETURNING 1
), gone_conflicts AS (
    DELETE FROM conflicts c USING doomed d
    WHERE c.scope_id = d.scope_id AND c.event_id = d.event_id RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS receipts,
       (SELECT count(*) FROM gone_attempts) AS attempts,
       (SELECT count(*) FROM gone_jobs) AS jobs,
       (SELECT count(*) FROM gone_bodies) AS unsigned_bodies,
       (SELECT count(*) FROM gone_conflicts) AS conflicts
""").bindparams(bindparam("cutoff", type_=UTCDateTime), bindparam("late", type_=UTCDateTime))

# PostgreSQL, before the receipts: attempts are inserted in time order, so those
# started before `:before` sit at the front of the heap. Each batch walks on from
# the last tuple the previous one looked at (a TID range scan: no rescan of the
# rows already deleted). Such an attempt belongs to a receipt accepted before the
# cutoff (CLOCK_SKEW covers hosts' clocks), which this purge deletes unless it is
# pending: a pending receipt's attempts stay (the NOT IN is one hashed lookup).
_PG_ATTEMPTS_BY_TIME = text("""
WITH picked AS (
    SELECT ctid FROM attempts
    WHERE ctid > CAST(:after AS tid) AND started_at < :before
      AND (scope_id, event_id) NOT IN (
            SELECT scope_id, event_id FROM receipts WHERE state = 0 AND accepted_at < :cutoff)
    LIMIT :batch
), gone AS (
    DELETE FROM attempts WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked))
      AND started_at < :before RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM picked) AS picked,
       CAST((SELECT max(ctid) FROM picked) AS text) AS last
""").bindparams(bindparam("cutoff", type_=UTCDateTime), bindparam("before", type_=UTCDateTime))

_SQLITE_BATCH = text("""
DELETE FROM receipts
WHERE rowid IN (SELECT rowid FROM receipts
                WHERE accepted_at < :cutoff AND state IN (1, 2) LIMIT :batch)
RETURNING scope_id, event_id, body_sha256
""").bindparams(bindparam("cutoff", type_=UTCDateTime))


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeResult:
    """What a purge removed (or, with dry_run, would remove)."""

    expired_receipts: int
    payloads_dropped: int
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `ledger purge --json` object."""
        return {"expired_receipts": self.expired_receipts,
                "payloads_dropped": self.payloads_dropped, "dry_run": self.dry_run}


def purge(engine: Engine, settings: Settings, clock: Clock, *, dry_run: bool = False,
          batch_size: int = DEFAULT_BATCH_SIZE, actor: audit.Actor | None = None,
          on_batch: Callable[[int], None] | None = None,
          duty_cycle: float = DEFAULT_DUTY_CYCLE) -> PurgeResult:
    """Expire finished receipts past retention and drop failed payloads past review."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if not 0 < duty_cycle <= 1:
        raise ValueError("duty_cycle must be in (0, 1]")
    now = clock.now()
    cutoff = now - timedelta(seconds=settings.retention_seconds)
    review_cutoff = now - timedelta(seconds=settings.review_window_seconds)
    if dry_run:
        with engine.connect() as conn:
            return PurgeResult(expired_receipts=count_expired(conn, cutoff),
                               payloads_dropped=count_expired_payloads(conn, review_cutoff),
                               dry_run=True)
    # Payloads first: a failed job past retention is also past review, so each
    # dropped payload is counted once, whichever step removes it.
    dropped = expire_payloads(engine, settings, review_cutoff, batch_size)
    expire_attempts_by_time(engine, settings, cutoff, batch_size, duty_cycle)
    expired = expire_receipts(engine, settings, cutoff, batch_size, on_batch, duty_cycle)
    expire_bookkeeping(engine, settings, cutoff)
    result = PurgeResult(expired_receipts=expired, payloads_dropped=dropped, dry_run=False)
    if actor is not None and (expired or dropped):
        with engine.begin() as conn:
            audit.record(conn, actor, "receipts.purge", "receipts", at=clock.now(),
                         detail={**result.to_json(), "cutoff": cutoff.isoformat()})
    log.info("purge done", expired_receipts=expired, payloads_dropped=dropped,
             cutoff=cutoff.isoformat())
    return result


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: purge and return the rows affected."""
    result = purge(engine, settings, clock, actor=audit.Actor(name="scheduler", role="system"))
    return result.expired_receipts + result.payloads_dropped


def count_expired(conn: Connection, cutoff: datetime) -> int:
    """Count finished receipts accepted before `cutoff`."""
    return int(conn.execute(
        select(func.count()).select_from(receipts)
        .where(receipts.c.accepted_at < cutoff, receipts.c.state.in_(FINISHED))
    ).scalar_one())


def count_expired_payloads(conn: Connection, review_cutoff: datetime) -> int:
    """Count failed jobs still holding a payload accepted before `review_cutoff`."""
    return int(conn.execute(
        select(func.count()).select_from(jobs).where(*_payload_due(review_cutoff))
    ).scalar_one())


def _payload_due(review_cutoff: datetime) -> tuple[Any, ...]:
    """Return the predicate of failed jobs whose payload outlived the review window."""
    return (jobs.c.status == JobStatus.FAILED.value, jobs.c.payload.is_not(None),
            jobs.c.accepted_at < review_cutoff)


def _set_lock_timeout(conn: Connection, settings: Settings) -> None:
    """Bound how long a batch waits for a row lock (PostgreSQL; SQLite has busy_timeout)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(settings.lock_timeout_ms)}")


def expire_payloads(engine: Engine, settings: Settings, review_cutoff: datetime,
                    batch_size: int) -> int:
    """Set payload = NULL on failed jobs past the review window, batch by batch."""
    total = 0
    while True:
        picked = (select(jobs.c.scope_id, jobs.c.event_id)
                  .where(*_payload_due(review_cutoff)).limit(batch_size))
        stmt = (update(jobs)
                .where(tuple_(jobs.c.scope_id, jobs.c.event_id).in_(picked),
                       *_payload_due(review_cutoff))
                .values(payload=None))

        def step(conn: Connection, stmt: Any = stmt) -> int:
            return conn.execute(stmt).rowcount

        count = _with_lock_retries(engine, settings, step)
        total += count
        PURGED_ROWS.labels("payloads").inc(count)
        if count < batch_size:
            return total


def expire_attempts_by_time(engine: Engine, settings: Settings, cutoff: datetime,
                            batch_size: int, duty_cycle: float = 1.0) -> int:
    """PostgreSQL: delete attempts older than the cutoff (less skew) unless still pending."""
    if engine.dialect.name != "postgresql":
        return 0
    params = {"cutoff": cutoff, "before": cutoff - CLOCK_SKEW, "batch": batch_size,
              "after": "(0,0)"}
    total = 0
    while True:
        def step(conn: Connection) -> Any:
            # Any plan then reads in ctid order (a synchronized seq scan could
            # start mid-table and make the cursor skip rows).
            conn.exec_driver_sql("SET LOCAL synchronize_seqscans = off")
            return conn.execute(_PG_ATTEMPTS_BY_TIME, params).one()

        row = _with_lock_retries(engine, settings, step, duty_cycle)
        total += row.deleted
        PURGED_ROWS.labels("attempts").inc(row.deleted)
        if row.picked < batch_size:
            return total
        params["after"] = row.last


def expire_receipts(engine: Engine, settings: Settings, cutoff: datetime, batch_size: int,
                    on_batch: Callable[[int], None] | None = None,
                    duty_cycle: float = 1.0) -> int:
    """Delete finished receipts before `cutoff` with their dependants, one batch per commit."""
    total = 0
    # A receipt finished before `late` has no attempt left after expire_attempts_by_time.
    params = {"cutoff": cutoff, "late": cutoff - 2 * CLOCK_SKEW, "batch": batch_size}
    while True:
        def step(conn: Connection) -> dict[str, int]:
            if conn.dialect.name == "postgresql":
                return dict(conn.execute(_PG_BATCH, params).one()._mapping)
            return _sqlite_batch(conn, cutoff, batch_size)

        counts = _with_lock_retries(engine, settings, step, duty_cycle)
        for kind, count in counts.items():
            PURGED_ROWS.labels(kind).inc(count)
        total += counts["receipts"]
        if on_batch is not None:
            on_batch(total)
        if counts["receipts"] < batch_size:
            return total


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
    return counts


def expire_bookkeeping(engine: Engine, settings: Settings, cutoff: datetime) -> None:
    """Drop run records, resolved findings and orphaned conflicts older than retention."""
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
    for kind, stmt in statements.items():
        def step(conn: Connection, stmt: Any = stmt) -> int:
            return conn.execute(stmt).rowcount

        PURGED_ROWS.labels(kind).inc(max(_with_lock_retries(engine, settings, step), 0))


def _with_lock_retries(engine: Engine, settings: Settings, step: Callable[[Connection], Any],
                       duty_cycle: float = 1.0) -> Any:
    """Run `step` in its own transaction (retried on a lock timeout), then pace the next one."""
    for attempt in range(LOCK_RETRIES):
        started = time.perf_counter()
        try:
            with engine.begin() as conn:
                _set_lock_timeout(conn, settings)
                out = step(conn)
            if duty_cycle < 1:
                time.sleep((time.perf_counter() - started) * (1 / duty_cycle - 1))
            return out
        except sa_exc.OperationalError as error:
            if attempt == LOCK_RETRIES - 1 or not _is_lock_timeout(error):
                raise
            log.warning("purge batch waited too long for a lock; retrying", attempt=attempt + 1)
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _is_lock_timeout(error: sa_exc.OperationalError) -> bool:
    """Tell a lock wait timeout (PostgreSQL 55P03, SQLite busy) from other failures."""
    code = getattr(error.orig, "sqlstate", None)
    return code == "55P03" or "database is locked" in str(error.orig)
