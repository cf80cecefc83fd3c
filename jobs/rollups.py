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
  previous one, a changed retention, an empty state or FULL_RECOUNT_SECONDS
  since the last full recount recount everything (the repair for drift, e.g. a
  receipt written with an old accepted_at by hand); `refresh(full_counts=True)`
  does it on demand.
- `hourly_series` (jobs/rollup_series.py): accepted and failed per scope per
  hour over SERIES_HOURS, kept incrementally on the same settled band; instead of
  a daily recount, each run recounts one hour of the window whole, in turn.
- `hourly_refusals` and `hourly_latency` (jobs/rollup_deliveries.py): refusals
  and answered deliveries per latency bucket per integration per hour, from the
  delivery log, added up as its rows settle.
Each run's time is in `rollup_marks.counted_at`, which the pages show as the figures' age.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, bindparam, delete, func, insert, select

from jobs.rollup_band import (
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
from jobs.rollup_deliveries import refresh_delivery_hours
from jobs.rollup_series import SERIES_HOURS, refresh_hourly_series
from ledger.clock import Clock
from ledger.config import DEFAULT_DELIVERY_LOG_SECONDS, DEFAULT_RETENTION_SECONDS, Settings
from ledger.db.schema import ROLLUP_MARK, receipts, scope_counts, scope_totals
from ledger.db.timestamps import as_utc
from ledger.domain import ReceiptState

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
    """What one scope_counts refresh did: rows written, receipts read, full or not."""

    written: int
    receipts_read: int
    full: bool


def totals_by_scope(conn: Connection, now: datetime, retention_seconds: float, *,
                    full: bool = False) -> tuple[dict[int, int], int, bool]:
    """Return ({scope_id: receipts}, receipts read, full?) and move the settled band."""
    band = settled_band(now, retention_seconds)
    # Locked: a CLI refresh racing the scheduled run would apply one delta twice.
    mark = mark_to_step(conn, ROLLUP_MARK, band, now, full=full)
    if mark is None:
        totals, settled, read = _count_all(conn, band)
        conn.execute(delete(scope_totals))
        _write_settled(conn, settled)
        recounted_at = now
        full = True
    else:
        totals, delta, read = _count_edges(conn, mark.band, band)
        for scope_id, n in _step_settled(conn, delta).items():
            totals[scope_id] = totals.get(scope_id, 0) + n
        recounted_at = mark.recounted_at
    write_mark(conn, ROLLUP_MARK, band, now, recounted_at)
    return totals, read, full


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


def _step_settled(conn: Connection, delta: dict[int, int]) -> dict[int, int]:
    """Apply `delta` to scope_totals; return every scope's settled count."""
    settled = {int(s): int(n) for s, n in conn.execute(select(scope_totals))}
    changed = {s: settled.get(s, 0) + d for s, d in delta.items() if d}
    emptied = [s for s, n in changed.items() if not n]
    if emptied:
        conn.execute(delete(scope_totals).where(scope_totals.c.scope_id.in_(emptied)))
    upsert(conn, scope_totals, ["scope_id"],
           [{"scope_id": s, "settled": n} for s, n in changed.items() if n])
    return settled | changed


def _write_settled(conn: Connection, settled: dict[int, int]) -> None:
    """Insert scope_totals rows for the non-empty scopes of `settled`."""
    rows = [{"scope_id": s, "settled": n} for s, n in settled.items() if n]
    if rows:
        conn.execute(insert(scope_totals), rows)


def refresh_scope_counts(conn: Connection, now: datetime, *,
                         retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                         full: bool = False) -> CountsRun:
    """Replace scope_counts with fresh figures (/metrics reads its receipt gauges from them)."""
    totals, read, full = totals_by_scope(conn, now, retention_seconds, full=full)
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
    return CountsRun(written=written, receipts_read=read, full=full)


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
