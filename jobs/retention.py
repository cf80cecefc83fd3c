"""Retention: expire finished receipts past the retention window, drop reviewed payloads.

A receipt is deleted only when it is `complete` or `failed` and was accepted
more than LEDGER_RETENTION_SECONDS ago; a pending receipt is never touched.
Its failed job, its unsigned-body record and its conflicts go in the same batch
transaction; its attempts go in that batch too, or (PostgreSQL, the bulk of
them) just before it by their own time, so a replay after expiry finds nothing
and becomes new work (the seed's stated consequence, README "Operations:
scheduled jobs"). A failed receipt an operator requeues while a purge runs keeps
its attempts (they stay while it has a job); a receipt run again ("Run again",
ledger/worker/rerun.py) after its retention loses its earlier completed attempts on
PostgreSQL.

Every batch is its own short transaction with `lock_timeout` set: intake keeps
committing between and during batches, and nothing references receipts with a
foreign key, so a batch costs no per-row FK check (several times the delete). On
PostgreSQL a batch is a window of heap pages; the Pacer leaves the intake its
share of the machine (LEDGER_PURGE_DUTY_CYCLE)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from itertools import repeat
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, text, tuple_, update
from sqlalchemy import exc as sa_exc

from ledger.access import audit
from ledger.clock import Clock
from ledger.config import CLOCK_SKEW_SECONDS, DEFAULT_DUTY_CYCLE, Settings, check_duty_cycle
from ledger.db import citus
from ledger.db.schema import (
    UTCDateTime,
    attempts,
    conflicts,
    findings,
    jobs,
    receipts,
    scheduler_runs,
    unsigned_bodies,
)
from ledger.domain import JobStatus, ReceiptState
from ledger.errors import LedgerError
from ledger.logs import get_logger
from ledger.metrics import PURGED_ROWS
from ledger.worker.failure_groups import forget_members, remove_failures

from . import retention_scoped as scoped

log = get_logger("ledger.jobs.retention")
_T = TypeVar("_T")
DEFAULT_BATCH_SIZE = 25_000
FINISHED = (ReceiptState.COMPLETE.code, ReceiptState.FAILED.code)
LOCK_RETRIES = 3
# How far apart the intake's and the workers' clocks may be: an attempt is never
# stamped more than this before its receipt's accepted_at (NTP keeps hosts far closer).
# The same allowance is part of the default retention (ledger.config).
CLOCK_SKEW = timedelta(seconds=CLOCK_SKEW_SECONDS)

# PostgreSQL walks each table in page windows: `ctid >= '(lo,0)' AND ctid < '(hi,0)'`
# is a TID range scan, so a batch reads its window once and deletes in the same
# pass (no LIMIT picker, no ctid array, no rescan of the rows earlier batches
# deleted: 2-3x less CPU per row).
# A window spans about `batch_size` rows (pg_class's rows per page); rows added
# after the purge starts land past the last window or are too new to expire. The
# walk covers the pages from the first to the last expired row (_expired_span);
# between them a window with nothing expired costs a filter, no delete.

# Attempts go first, by their own time: one started before `:before` belongs to a
# receipt accepted before the cutoff (CLOCK_SKEW covers hosts' clocks), which this
# purge deletes unless it is unfinished. An unfinished receipt (pending or failed)
# is exactly one with a job row, so an attempt stays while its receipt has a job:
# a pending receipt keeps its history, and a failed one keeps it for the receipts
# pass below, which deletes it with its receipt under the receipt's row lock. (A
# failed receipt requeued between the two passes keeps its history too; the check
# on the receipt's state that this replaces deleted it.) An attempt whose outcome is
# 'complete' needs no lookup: it completed its receipt and deleted its job in the
# same transaction (only "Run again" gives a completed receipt a job again; past the
# retention its earlier completed attempts then go, as before). The others probe
# the job's primary key: the jobs table holds only unfinished work, so its key stays
# small enough to stay in shared_buffers at any ledger size, where the receipts' key
# (730 MB at 10M receipts) would be read into them for most probes. (A `NOT IN (pending receipts)`
# set is hashed only while it fits
# in work_mem; past that PostgreSQL rescans the whole set for every row: 37 s per
# window at 10M.)
_PG_ATTEMPTS_WINDOW = text("""
DELETE FROM attempts a
WHERE a.ctid >= CAST(:lo AS tid) AND a.ctid < CAST(:hi AS tid) AND a.started_at < :before
  AND (a.outcome = 'complete' OR NOT EXISTS (
        SELECT 1 FROM jobs j WHERE j.scope_id = a.scope_id AND j.event_id = a.event_id))
""").bindparams(bindparam("before", type_=UTCDateTime))

# Receipts, statement 1 of a batch: lock the window's expired receipts that still
# have dependants, delete those dependants and the receipts. After the attempts
# pass that is a failed receipt (attempts, job), one finished after `:late`
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

_PG_WINDOW_SIZE = text("""
SELECT pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,
       CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages END AS per_page
FROM pg_class c WHERE c.oid = CAST(:table AS regclass)
""")
# Rows per page assumed before the table was ever analyzed (a receipt is ~150 B),
# and the least assumed after: a table emptied by an earlier purge averages few
# rows per page, and a window sized on that average must not swallow its dense
# part (a page holds at most ~90 receipts or attempts) in one transaction.
DEFAULT_ROWS_PER_PAGE = 50
MIN_ROWS_PER_PAGE = 30
# Attempts rows are never locked by the intake, and an attempts batch may hash the
# unfinished jobs' keys once (when they fit in work_mem), so its windows are larger.
ATTEMPTS_WINDOW_FACTOR = 4

_SQLITE_BATCH = text("""
DELETE FROM receipts
WHERE rowid IN (SELECT rowid FROM receipts
                WHERE accepted_at < :cutoff AND state IN (1, 2) LIMIT :batch)
RETURNING scope_id, event_id, body_sha256
""").bindparams(bindparam("cutoff", type_=UTCDateTime))


class PurgeImpossible(LedgerError):
    """The purge cannot do its job on this database; it says why instead of deleting nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


@dataclass(slots=True)
class Pacer:
    """Keep the purge's batches to a share of wall time, leaving the rest to the intake.

    After a batch that took t seconds it sleeps t * (1 / duty_cycle - 1): at 0.5
    the purge runs half the time at full speed. On 2 cores a full-speed purge
    takes the CPU a CPU-bound intake needs.
    """

    duty_cycle: float = DEFAULT_DUTY_CYCLE
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        check_duty_cycle(self.duty_cycle)

    def rest(self, busy_seconds: float) -> None:
        """Sleep after a batch that kept the database busy for `busy_seconds`."""
        if self.duty_cycle < 1 and busy_seconds > 0:
            self.sleep(busy_seconds * (1 / self.duty_cycle - 1))


def purge(engine: Engine, settings: Settings, clock: Clock, *, dry_run: bool = False,
          batch_size: int = DEFAULT_BATCH_SIZE, actor: audit.Actor | None = None,
          on_batch: Callable[[int], None] | None = None,
          pacer: Pacer | None = None) -> PurgeResult:
    """Expire finished receipts past retention and drop failed payloads past review.

    Batches are paced by the operator's LEDGER_PURGE_DUTY_CYCLE unless `pacer` is given.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    pacer = pacer or Pacer(settings.purge_duty_cycle)
    now = clock.now()
    cutoff = now - timedelta(seconds=settings.retention_seconds)
    review_cutoff = now - timedelta(seconds=settings.review_window_seconds)
    if dry_run:
        with engine.connect() as conn:
            return PurgeResult(expired_receipts=count_expired(conn, cutoff),
                               payloads_dropped=count_expired_payloads(conn, review_cutoff),
                               dry_run=True)
    if _distributed(engine):
        dropped = scoped_payloads(engine, settings, review_cutoff, batch_size)
        expired = scoped_receipts(engine, settings, cutoff, batch_size, on_batch, pacer)
        expire_bookkeeping(engine, settings, cutoff, scoped_conflicts=True)
        _check_nothing_left(engine, cutoff, now)
        # On Citus a kept conflict body leaves with its conflict record at retention (the
        # batched cross-scope UPDATE below cannot be routed to one shard): README, Limits.
        bodies = 0
    else:
        # Payloads first: a failed job past retention is also past review, so each
        # dropped payload is counted once, whichever step removes it.
        dropped = expire_payloads(engine, settings, review_cutoff, batch_size)
        bodies = expire_conflict_bodies(engine, settings, review_cutoff, batch_size)
        expire_attempts_by_time(engine, settings, cutoff, batch_size, pacer)
        expired = expire_receipts(engine, settings, cutoff, batch_size, on_batch, pacer)
        expire_bookkeeping(engine, settings, cutoff)
    from .retention_preview import (  # it imports this module
        drop_expired_forensic_bodies,
        drop_expired_sender_tokens,
        drop_old_requeue_members,
    )

    bodies += drop_expired_forensic_bodies(engine, now, batch_size)
    PURGED_ROWS.labels("sender_tokens").inc(drop_expired_sender_tokens(engine, now, batch_size))
    drop_old_requeue_members(engine, cutoff)
    result = PurgeResult(expired_receipts=expired, payloads_dropped=dropped, dry_run=False)
    if actor is not None and (expired or dropped):
        with engine.begin() as conn:
            audit.record(conn, actor, "receipts.purge", "receipts", at=clock.now(),
                         detail={**result.to_json(), "cutoff": cutoff.isoformat()})
    log.info("purge done", expired_receipts=expired, payloads_dropped=dropped,
             conflict_bodies_dropped=bodies, cutoff=cutoff.isoformat())
    return result


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: purge and return the rows affected."""
    result = purge(engine, settings, clock, actor=audit.Actor(name="scheduler", role="system"))
    return result.expired_receipts + result.payloads_dropped


def _distributed(engine: Engine) -> bool:
    """Tell, afresh, whether the ledger is distributed; refuse a half-distributed one."""
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as conn:
        layout = citus.layout(conn)
    problems = layout.problems()
    if problems:
        raise PurgeImpossible("the ledger is partly distributed, so neither the page-window "
                              "purge nor the per-scope purge would find every expired row: "
                              + "; ".join(problems) + " (run `ledger db distribute`)")
    return layout.distributed


def scoped_payloads(engine: Engine, settings: Settings, review_cutoff: datetime,
                    batch_size: int) -> int:
    """Distributed: drop reviewed failed payloads scope by scope, batch by batch."""
    with engine.connect() as conn:
        scopes = scoped.payload_scopes(conn, review_cutoff)
    total = 0
    for scope in scopes:
        while True:
            count = _with_lock_retries(engine, settings, partial(
                scoped.scope_payloads, scope=scope, review_cutoff=review_cutoff,
                batch=batch_size))
            total += count
            PURGED_ROWS.labels("payloads").inc(count)
            if count < batch_size:
                break
    return total


def scoped_receipts(engine: Engine, settings: Settings, cutoff: datetime, batch_size: int,
                    on_batch: Callable[[int], None] | None = None,
                    pacer: Pacer | None = None) -> int:
    """Distributed: delete expired receipts with their dependants, scope by scope."""
    with engine.connect() as conn:
        scopes = scoped.expired_scopes(conn, cutoff)
    total = 0
    for scope in scopes:
        while True:
            counts = _with_lock_retries(engine, settings, partial(
                scoped.scope_batch, scope=scope, cutoff=cutoff, batch=batch_size), pacer)
            for kind, count in counts.items():
                PURGED_ROWS.labels(kind).inc(count)
            total += counts["receipts"]
            if on_batch is not None:
                on_batch(total)
            if counts["receipts"] < batch_size:
                break
    return total


def _check_nothing_left(engine: Engine, cutoff: datetime, started: datetime) -> None:
    """Raise when expired receipts that finished before the purge began are still there."""
    with engine.connect() as conn:
        left = scoped.left_behind(conn, cutoff, started)
    if left:
        raise PurgeImpossible(f"{left} expired receipts are still there after the purge "
                              "(finished before it began, accepted before the cutoff)")


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
                .values(payload=None, raw_body=None))

        def step(conn: Connection, stmt: Any = stmt) -> int:
            return conn.execute(stmt).rowcount

        count = _with_lock_retries(engine, settings, step)
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

        count = _with_lock_retries(engine, settings, step)
        total += count
        PURGED_ROWS.labels("conflict_bodies").inc(count)
        if count < batch_size:
            return total


def expire_attempts_by_time(engine: Engine, settings: Settings, cutoff: datetime,
                            batch_size: int, pacer: Pacer | None = None) -> int:
    """PostgreSQL: delete attempts older than the cutoff (less skew) but an unfinished job's."""
    if engine.dialect.name != "postgresql":
        return 0
    params: dict[str, Any] = {"before": cutoff - CLOCK_SKEW}
    total = 0
    for lo, hi in _page_windows(engine, "attempts", batch_size * ATTEMPTS_WINDOW_FACTOR,
                                "started_at < :before", params):
        def step(conn: Connection, lo: int = lo, hi: int = hi) -> int:
            conn.exec_driver_sql("SET LOCAL jit = off")
            return conn.execute(_PG_ATTEMPTS_WINDOW, {**params, **_tids(lo, hi)}).rowcount

        deleted = _with_lock_retries(engine, settings, step, pacer)
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
            partial(_pg_batch, params={**params, **_tids(lo, hi)})
            for lo, hi in _page_windows(engine, "receipts", batch_size,
                                        "accepted_at < :cutoff AND state IN (1, 2)", params))
    else:
        batches = repeat(partial(_sqlite_batch, cutoff=cutoff, batch_size=batch_size))
    for step in batches:
        counts = _with_lock_retries(engine, settings, step, pacer)
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


def _page_windows(engine: Engine, table: str, rows: int, expired: str,
                  params: dict[str, Any]) -> Iterator[tuple[int, int]]:
    """Yield [lo, hi) page ranges of `table`, about `rows` rows each, that may hold expired rows."""
    with engine.connect() as conn:
        size = conn.execute(_PG_WINDOW_SIZE, {"table": table}).one()
        per_page = max(float(size.per_page or DEFAULT_ROWS_PER_PAGE), MIN_ROWS_PER_PAGE)
        width = max(1, int(rows / per_page))
        first, last = _expired_span(conn, table, expired, params, int(size.pages), width)
    for lo in range(first, last, width):
        yield lo, lo + width


def _expired_span(conn: Connection, table: str, expired: str, params: dict[str, Any],
                  pages: int, width: int) -> tuple[int, int]:
    """Return the pages [first, last) holding rows that match `expired`.

    When the first and the last window both hold some (a purge of most of the
    table), that is the whole table, found without reading it. Otherwise (the
    hourly purge of an hour's receipts) min/max(ctid) reads only the expired
    rows, found through the index on the time column (a btree on receipts, a BRIN
    on attempts), instead of a walk over days of rows that stay.
    """
    def any_in(lo: int, hi: int) -> bool:
        return bool(conn.execute(text(
            f"SELECT EXISTS (SELECT 1 FROM {table} WHERE ctid >= CAST(:lo AS tid) "
            f"AND ctid < CAST(:hi AS tid) AND {expired})"), {**params, **_tids(lo, hi)}
        ).scalar_one())

    if pages == 0:
        return 0, 0
    if any_in(0, width) and any_in(max(pages - width, 0), pages):
        return 0, pages
    low, high = conn.execute(text(
        f"SELECT CAST(min(ctid) AS text), CAST(max(ctid) AS text) FROM {table} "
        f"WHERE {expired}"), params).one()
    if low is None:
        return 0, 0
    return _block(low), _block(high) + 1


def _block(tid: str) -> int:
    """Return the page number of a tid literal such as '(123,4)'."""
    return int(tid.strip("()").split(",")[0])


def _tids(lo: int, hi: int) -> dict[str, str]:
    """Return the bounds of a page window as tid literals."""
    return {"lo": f"({lo},0)", "hi": f"({hi},0)"}


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

        PURGED_ROWS.labels(kind).inc(max(_with_lock_retries(engine, settings, step), 0))
    if scoped_conflicts:
        with engine.connect() as conn:
            scopes = scoped.orphan_scopes(conn, cutoff)
        for scope in scopes:
            PURGED_ROWS.labels("conflicts").inc(_with_lock_retries(engine, settings, partial(
                scoped.scope_orphans, scope=scope, cutoff=cutoff)))


def _with_lock_retries(engine: Engine, settings: Settings, step: Callable[[Connection], _T],
                       pacer: Pacer | None = None) -> _T:
    """Run `step` in its own transaction (retried on a lock timeout), then pace the next one."""
    for attempt in range(LOCK_RETRIES):
        started = time.perf_counter()
        try:
            with engine.begin() as conn:
                _set_lock_timeout(conn, settings)
                out = step(conn)
            if pacer is not None:
                pacer.rest(time.perf_counter() - started)
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
