"""Rollups the dashboard reads instead of counting millions of receipts per page view.

- `scope_counts`: receipts per scope and state, with the oldest accepted_at of
  pending and failed receipts. Complete = total - pending - failed. Pending and
  failed come from the partial index ix_receipts_open (the unfinished receipts
  only, so every state change is seen). The total is kept incrementally in
  `scope_totals`: receipts accepted inside a *settled band* [settled_from,
  settled_until), which no intake transaction still writes into (it ends
  SETTLE_LAG_SECONDS ago) and no purge can reach before the next run (it starts
  PURGE_MARGIN_SECONDS after the retention cutoff). A run adds the receipts that
  entered the band, subtracts those that left it and counts fresh only the two
  edges: the newest minute and the receipts old enough to be purged. So it
  reads what changed since the last run plus the purge's own band, not the
  table. A run more than PURGE_MARGIN_SECONDS - CLOCK_SKEW_SECONDS after the
  previous one, a changed retention or an empty state recount everything;
  `refresh(full_counts=True)` does it on demand. The repair for drift (e.g. a
  receipt committed long after its accepted_at, or written by hand) is spread
  over the runs instead of a daily recount of the table (2.4-2.6 s at 10M
  receipts): each run also counts the receipts of the next few scopes whole,
  as many as the time since the previous run is of REPAIR_CYCLE_SECONDS (a
  day), the cursor kept in `rollup_marks.repaired_scope`, so every scope is
  recounted within a day and one run, whatever the runs' period.
- `hourly_series` (jobs/rollup_series.py): accepted and failed per scope per
  hour over SERIES_HOURS, kept incrementally on the same settled band; instead of
  a daily recount, each run recounts one hour of the window whole, in turn.
- `hourly_refusals` and `hourly_latency` (jobs/rollup_deliveries.py): refusals
  and answered deliveries per latency bucket per integration per hour, from the
  delivery log, added up as its rows settle.
Each run's time is in `rollup_marks.counted_at`, which the pages show as the figures' age.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import psycopg
from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    bindparam,
    delete,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy import exc as sa_exc

from ledger.clock import Clock
from ledger.config import DEFAULT_DELIVERY_LOG_SECONDS, DEFAULT_RETENTION_SECONDS, Settings
from ledger.db.schema import ROLLUP_MARK, integrations, receipts, scope_counts, scope_totals
from ledger.db.timestamps import as_utc
from ledger.domain import ReceiptState
from ledger.logs import get_logger

from .rollup_band import (
    FULL_RECOUNT_SECONDS,
    PURGE_MARGIN_SECONDS,
    SETTLE_LAG_SECONDS,
    Band,
    flag,
    mark_to_step,
    settled_band,
    upsert,
    write_mark,
)
from .rollup_deliveries import refresh_delivery_hours
from .rollup_series import SERIES_HOURS, refresh_hourly_series

log = get_logger("ledger.jobs.rollups")
# Every scope's receipts are recounted whole once in this time and one run (a slice a run).
REPAIR_CYCLE_SECONDS = FULL_RECOUNT_SECONDS

# Re-exported: the rollups' constants and steps are read from here.
__all__ = ["FULL_RECOUNT_SECONDS", "PURGE_MARGIN_SECONDS", "SERIES_HOURS",
           "SETTLE_LAG_SECONDS", "refresh", "refresh_delivery_hours", "refresh_hourly_series",
           "refresh_scope_counts", "run", "settled_band"]


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: refresh every rollup; return the rows written."""
    return refresh(engine, clock, retention_seconds=settings.retention_seconds,
                   delivery_log_seconds=settings.delivery_log_seconds)


def refresh(engine: Engine, clock: Clock, *, full_series: bool = False,
            full_counts: bool = False,
            retention_seconds: float = DEFAULT_RETENTION_SECONDS,
            delivery_log_seconds: float = DEFAULT_DELIVERY_LOG_SECONDS) -> int:
    """Refresh scope_counts, hourly_series and the delivery hours, one transaction each.

    Each is incremental; `full_counts` / `full_series` recount from the tables (the
    repair path), and each also recounts by itself when its mark says it must.
    """
    now = clock.now()
    with engine.begin() as conn:
        written = refresh_scope_counts(conn, now, retention_seconds=retention_seconds,
                                       full=full_counts).written
    with engine.begin() as conn:
        written += refresh_hourly_series(conn, now, retention_seconds=retention_seconds,
                                         full=full_series).written
    with engine.begin() as conn:
        written += refresh_delivery_hours(conn, now, log_seconds=delivery_log_seconds,
                                          full=full_series).written
    return written


@dataclass(frozen=True, slots=True, kw_only=True)
class CountsRun:
    """What one scope_counts refresh did: rows written, receipts read, full or not.

    `receipts_read` counts what changed and the unfinished receipts (everything in a full
    count); `repair_read` the receipts of the scopes an incremental run recounted whole.
    """

    written: int
    receipts_read: int
    full: bool
    repair_read: int = 0
    repair_skipped: bool = False  # the slice's count passed the statement timeout


def totals_by_scope(conn: Connection, now: datetime, retention_seconds: float, *,
                    full: bool = False) -> tuple[dict[int, int], CountsRun]:
    """Return the receipts per scope and what was read (nothing written yet), and move
    the settled band (and the repair's slice)."""
    band = settled_band(now, retention_seconds)
    # Locked: a CLI refresh racing the scheduled run would apply one delta twice.
    mark = mark_to_step(conn, ROLLUP_MARK, band, now, full=full, recount_seconds=None)
    if mark is None:
        totals, settled, read = _count_all(conn, band)
        conn.execute(delete(scope_totals))
        _write_settled(conn, {}, settled)
        write_mark(conn, ROLLUP_MARK, band, now, now)
        return totals, CountsRun(written=0, receipts_read=read, full=True)
    totals, delta, read = _count_edges(conn, mark.band, band)
    stored = {int(s): int(n) for s, n in conn.execute(select(scope_totals))}
    settled = stored | {s: stored.get(s, 0) + d for s, d in delta.items() if d}
    # The repair: the next scopes' receipts counted whole, in one statement (one snapshot),
    # replace what the steps made of them.
    after, until = mark.repaired_scope, _slice_end(conn, mark.repaired_scope,
                                                   now - mark.counted_at)
    recounted = _recount_within_timeout(conn, after, until, band)
    if recounted is not None:
        for scope_id in settled.keys() | totals.keys() | recounted.keys():
            if (after is None or scope_id > after) and (until is None or scope_id <= until):
                total, inside = recounted.get(scope_id, (0, 0))
                settled[scope_id], totals[scope_id] = inside, total - inside
    _write_settled(conn, stored, settled)
    for scope_id, n in settled.items():
        totals[scope_id] = totals.get(scope_id, 0) + n
    # A skipped slice is passed too: the next run goes on, not back to the same scopes.
    write_mark(conn, ROLLUP_MARK, band, now, mark.recounted_at, repaired_scope=until)
    return totals, CountsRun(
        written=0, receipts_read=read, full=False, repair_skipped=recounted is None,
        repair_read=sum(total for total, _ in (recounted or {}).values()))


def _count_all(conn: Connection, band: Band) -> tuple[dict[int, int], dict[int, int], int]:
    """Count every receipt per scope; return (totals, settled band counts, rows read)."""
    at = receipts.c.accepted_at
    totals: dict[int, int] = {}
    settled: dict[int, int] = {}
    for scope_id, total, inside in conn.execute(
            select(receipts.c.scope_id, func.count(),
                   func.sum(flag((at >= band.start) & (at < band.end))))
            .group_by(receipts.c.scope_id)):
        totals[scope_id], settled[scope_id] = int(total), int(inside or 0)
    return totals, settled, sum(totals.values())


def _count_edges(conn: Connection, prev: Band, band: Band
                 ) -> tuple[dict[int, int], dict[int, int], int]:
    """Count the unsettled edges fresh and the band's moves; return (edges, delta, read).

    Old edge: accepted before band.start (purgeable soon); those at or after
    prev.start were settled and leave the band. New edge: accepted at or after
    prev.end; those before band.end enter the band, the rest are the fresh tail.
    """
    at = receipts.c.accepted_at
    edges: dict[int, int] = {}
    delta: dict[int, int] = {}
    read = 0
    old_edge = (select(receipts.c.scope_id, func.count(), func.sum(flag(at >= prev.start)))
                .where(at < band.start).group_by(receipts.c.scope_id))
    new_edge = (select(receipts.c.scope_id, func.count(), func.sum(flag(at < band.end)))
                .where(at >= prev.end).group_by(receipts.c.scope_id))
    for sign, query in ((-1, old_edge), (1, new_edge)):
        for scope_id, n, moved in conn.execute(query):
            n, moved = int(n), int(moved or 0)
            read += n
            delta[scope_id] = delta.get(scope_id, 0) + sign * moved
            # The old edge counts in full (its settled rows leave the band); of
            # the new edge only the tail is outside the band.
            edges[scope_id] = edges.get(scope_id, 0) + (n if sign < 0 else n - moved)
    return edges, delta, read


def _slice_end(conn: Connection, after: int | None, since_run: timedelta) -> int | None:
    """Return the last scope id of this run's repair slice, which starts after `after`
    (the previous run's last; None: the first scope): as many scopes as `since_run` is of
    REPAIR_CYCLE_SECONDS, at least one. None: the slice runs to the last scope, and the
    next one starts again from the first.

    The slices follow each other through the scope ids at the rate time passes, so every
    scope is recounted whole within a cycle and one run (a slice that reaches the last
    scope ends there), whatever the runs' period.
    """
    scopes = conn.execute(select(func.count()).select_from(integrations)).scalar_one()
    size = max(1, math.ceil(scopes * since_run.total_seconds() / REPAIR_CYCLE_SECONDS))
    query = select(integrations.c.id).order_by(integrations.c.id).limit(size)
    if after is not None:
        query = query.where(integrations.c.id > after)
    ids = conn.execute(query).scalars().all()
    return int(ids[-1]) if len(ids) == size else None


def _recount_within_timeout(conn: Connection, after: int | None, until: int | None,
                            band: Band) -> dict[int, tuple[int, int]] | None:
    """Return `_recount_scopes`, or None when it ran past the statement timeout.

    On PostgreSQL the count runs in a savepoint: a scope so big (or so cold) that its
    count passes `LEDGER_STATEMENT_TIMEOUT_MS` is skipped, with a warning, instead of
    failing every run at the same slice and leaving the figures stale for good.
    """
    if conn.dialect.name != "postgresql":  # no statement timeout on SQLite
        return _recount_scopes(conn, after, until, band)
    savepoint = conn.begin_nested()
    try:
        counted = _recount_scopes(conn, after, until, band)
    except sa_exc.OperationalError as error:
        if not isinstance(error.orig, psycopg.errors.QueryCanceled):
            raise
        savepoint.rollback()
        log.warning("rollups.repair_skipped", after_scope=after, until_scope=until,
                    hint="the next full count recounts them: after a pause over the purge margin,"
                         " or refresh(full_counts=True)")
        return None
    savepoint.commit()
    return counted


def _recount_scopes(conn: Connection, after: int | None, until: int | None, band: Band
                    ) -> dict[int, tuple[int, int]]:
    """Count the receipts of the scopes in (after, until] whole, in one statement:
    {scope: (receipts, receipts inside the band)}.

    All of a scope's receipts come from the primary key alone (an index-only scan on
    PostgreSQL, however big the scope); only those outside the band, the two edges, are
    read from the table, through the accepted_at index.
    """
    at, scope = receipts.c.accepted_at, receipts.c.scope_id
    in_slice = [c for c in ((scope > after) if after is not None else None,
                            (scope <= until) if until is not None else None) if c is not None]
    every = (select(scope.label("scope_id"), func.count().label("n"),
                    literal(0, Integer).label("outside"))
             .where(*in_slice).group_by(scope))
    outside = (select(scope, literal(0, Integer), func.count())
               .where(*in_slice, or_(at < band.start, at >= band.end)).group_by(scope))
    both = union_all(every, outside).subquery()
    rows = conn.execute(select(both.c.scope_id, func.sum(both.c.n), func.sum(both.c.outside))
                        .group_by(both.c.scope_id))
    return {int(s): (int(n), int(n) - int(o)) for s, n, o in rows}


def _write_settled(conn: Connection, stored: dict[int, int], settled: dict[int, int]) -> None:
    """Write the scope_totals rows of `settled` that differ from `stored` (delete emptied)."""
    changed = {s: n for s, n in settled.items() if stored.get(s, 0) != n}
    emptied = [s for s, n in changed.items() if not n and s in stored]
    if emptied:
        conn.execute(delete(scope_totals).where(scope_totals.c.scope_id.in_(emptied)))
    upsert(conn, scope_totals, ["scope_id"],
           [{"scope_id": s, "settled": n} for s, n in changed.items() if n])


def refresh_scope_counts(conn: Connection, now: datetime, *,
                         retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                         full: bool = False) -> CountsRun:
    """Replace scope_counts with fresh figures (/metrics reads its receipt gauges from them)."""
    totals, step = totals_by_scope(conn, now, retention_seconds, full=full)
    read = step.receipts_read
    unfinished = conn.execute(
        select(receipts.c.scope_id, receipts.c.state, func.count(),
               func.min(receipts.c.accepted_at))
        .where(receipts.c.state != ReceiptState.COMPLETE.code)
        .group_by(receipts.c.scope_id, receipts.c.state)).all()
    counts: dict[tuple[int, int], tuple[int, datetime | None]] = {}
    open_per_scope: dict[int, int] = {}
    for scope_id, state, count, oldest in unfinished:
        counts[(scope_id, state)] = (int(count), as_utc(oldest))
        open_per_scope[scope_id] = open_per_scope.get(scope_id, 0) + int(count)
        read += int(count)
    for scope_id, total in totals.items():
        complete = total - open_per_scope.get(scope_id, 0)
        if complete:
            counts[(scope_id, ReceiptState.COMPLETE.code)] = (complete, None)
    written = _write_changed_counts(conn, counts, now)
    return replace(step, written=written, receipts_read=read)


def _write_changed_counts(conn: Connection,
                          counts: dict[tuple[int, int], tuple[int, datetime | None]],
                          now: datetime) -> int:
    """Rewrite only the scope_counts rows that changed; return how many were written.

    At 10,000 scopes rewriting all ~25,000 rows cost more than the counting.
    Their refreshed_at says when a row last changed; the run's time is in
    rollup_marks.counted_at (what the pages and /metrics show as the age).
    """
    columns = (scope_counts.c.scope_id, scope_counts.c.state, scope_counts.c.count,
               scope_counts.c.oldest_accepted_at)
    stored = {(scope_id, state): (int(n), as_utc(oldest))
              for scope_id, state, n, oldest in conn.execute(select(*columns))}
    changed = {key: value for key, value in counts.items() if stored.get(key) != value}
    gone = [{"s": s, "st": st} for s, st in stored if (s, st) not in counts]
    if gone:
        conn.execute(delete(scope_counts).where(scope_counts.c.scope_id == bindparam("s"),
                                                scope_counts.c.state == bindparam("st")), gone)
    upsert(conn, scope_counts, ["scope_id", "state"], [
        {"scope_id": scope_id, "state": state, "count": count, "oldest_accepted_at": oldest,
         "refreshed_at": now} for (scope_id, state), (count, oldest) in changed.items()])
    return len(changed) + len(gone)
