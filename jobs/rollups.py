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
- `hourly_series`: accepted (by accepted_at) and failed (by the time they failed)
  per scope per hour over the last SERIES_HOURS hours. Closed hours do not
  change, so a run recomputes only the newest hours, and the whole window once
  the series is an hour old (a requeue can lower a closed hour's failures):
  29 ms for the newest 2 hours, 174 ms for all 48, at 1M receipts (the window is
  now 7 days for the per-integration health charts; the hourly full refresh reads
  7 days of receipts).
Both carry `refreshed_at`, which the pages show as the figures' age.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    select,
    text,
)

from ledger.clock import Clock
from ledger.config import CLOCK_SKEW_SECONDS, DEFAULT_RETENTION_SECONDS, Settings
from ledger.db.schema import (
    ROLLUP_MARK,
    hourly_series,
    receipts,
    rollup_marks,
    scope_counts,
    scope_totals,
)
from ledger.db.timestamps import as_utc
from ledger.domain import ReceiptState
from ledger.scheduling.runner import advisory_key

SERIES_HOURS = 7 * 24  # the overview charts 48 h; per-integration health shows 24 h and 7 days
RECENT_HOURS = 2
FULL_REFRESH_SECONDS = 3600
# Intake stamps accepted_at before it commits: receipts younger than this are
# recounted every run instead of settled, so a commit up to a minute late is
# still counted (a later one waits for the daily full recount).
SETTLE_LAG_SECONDS = 60
# The settled band starts this far after the retention cutoff; a purge (on any
# instance, clock skew included) cannot delete from it before the next run.
PURGE_MARGIN_SECONDS = 1800
FULL_RECOUNT_SECONDS = 86400


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: refresh both rollups; return the rows written."""
    return refresh(engine, clock, retention_seconds=settings.retention_seconds)


def refresh(engine: Engine, clock: Clock, *, full_series: bool | None = None,
            full_counts: bool = False,
            retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> int:
    """Refresh scope_counts and hourly_series in one short transaction each."""
    now = clock.now()
    with engine.begin() as conn:
        written = refresh_scope_counts(conn, now, retention_seconds=retention_seconds,
                                       full=full_counts).written
    with engine.begin() as conn:
        if full_series is None:
            # Only the newest hours are rewritten between full refreshes, so the
            # oldest refreshed_at tells when the whole window was last recomputed.
            oldest = conn.execute(select(func.min(hourly_series.c.refreshed_at))).scalar()
            full_series = oldest is None or oldest < now - timedelta(
                seconds=FULL_REFRESH_SECONDS)
        written += refresh_hourly_series(conn, now,
                                         hours=SERIES_HOURS if full_series else RECENT_HOURS)
    return written


@dataclass(frozen=True, slots=True, kw_only=True)
class CountsRun:
    """What one scope_counts refresh did: rows written, receipts read, full or not."""

    written: int
    receipts_read: int
    full: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """The settled band [start, end) of accepted_at."""

    start: datetime
    end: datetime


def settled_band(now: datetime, retention_seconds: float) -> Band:
    """Return the band a run at `now` settles (empty when retention is that short)."""
    end = now - timedelta(seconds=SETTLE_LAG_SECONDS)
    start = now + timedelta(seconds=PURGE_MARGIN_SECONDS - retention_seconds)
    return Band(start=min(start, end), end=end)


@dataclass(frozen=True, slots=True, kw_only=True)
class Mark:
    """Where the last run left the settled band, and when it last recounted in full."""

    band: Band
    counted_at: datetime
    recounted_at: datetime


def read_mark(conn: Connection) -> Mark | None:
    """Return the stored mark of scope_totals, if any."""
    row = conn.execute(select(rollup_marks).where(rollup_marks.c.name == ROLLUP_MARK)).first()
    if row is None:
        return None
    start, end = as_utc(row.settled_from), as_utc(row.settled_until)
    counted, recounted = as_utc(row.counted_at), as_utc(row.recounted_at)
    assert start and end and counted and recounted  # NOT NULL columns
    return Mark(band=Band(start=start, end=end), counted_at=counted, recounted_at=recounted)


def totals_by_scope(conn: Connection, now: datetime, retention_seconds: float, *,
                    full: bool = False) -> tuple[dict[int, int], int, bool]:
    """Return ({scope_id: receipts}, receipts read, full?) and move the settled band."""
    band = settled_band(now, retention_seconds)
    if conn.dialect.name == "postgresql":
        # A CLI refresh racing the scheduled run would apply one delta twice.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                     {"key": advisory_key(ROLLUP_MARK)})
    mark = read_mark(conn)
    if full or mark is None or not _can_step(mark, band, now):
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
    conn.execute(delete(rollup_marks).where(rollup_marks.c.name == ROLLUP_MARK))
    conn.execute(insert(rollup_marks).values(name=ROLLUP_MARK, settled_from=band.start,
                                             settled_until=band.end, counted_at=now,
                                             recounted_at=recounted_at))
    return totals, read, full


def _can_step(mark: Mark, band: Band, now: datetime) -> bool:
    """Return whether the stored band can be moved forward to `band` exactly."""
    since_run = now - mark.counted_at
    return (timedelta(0) <= since_run
            <= timedelta(seconds=PURGE_MARGIN_SECONDS - CLOCK_SKEW_SECONDS)
            and now - mark.recounted_at < timedelta(seconds=FULL_RECOUNT_SECONDS)
            and mark.band.start <= band.start and mark.band.end <= band.end
            # A changed retention changes the band's width: recount.
            and mark.band.end - mark.band.start == band.end - band.start)


def _flag(condition: Any) -> Any:
    """Return 1 where `condition` holds, else 0, for a SUM."""
    return case((condition, 1), else_=0)


def _count_all(conn: Connection, band: Band) -> tuple[dict[int, int], dict[int, int], int]:
    """Count every receipt per scope; return (totals, settled band counts, rows read)."""
    at = receipts.c.accepted_at
    totals: dict[int, int] = {}
    settled: dict[int, int] = {}
    for scope_id, total, inside in conn.execute(
            select(receipts.c.scope_id, func.count(),
                   func.sum(_flag((at >= band.start) & (at < band.end))))
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
    old_edge = (select(receipts.c.scope_id, func.count(), func.sum(_flag(at >= prev.start)))
                .where(at < band.start).group_by(receipts.c.scope_id))
    new_edge = (select(receipts.c.scope_id, func.count(), func.sum(_flag(at < band.end)))
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
    if changed:
        conn.execute(delete(scope_totals).where(scope_totals.c.scope_id.in_(list(changed))))
        _write_settled(conn, changed)
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
    gone = [key for key in stored if key not in counts]
    stale = [{"s": s, "st": st} for s, st in [*gone, *(k for k in changed if k in stored)]]
    if stale:
        conn.execute(delete(scope_counts).where(scope_counts.c.scope_id == bindparam("s"),
                                                scope_counts.c.state == bindparam("st")), stale)
    if changed:
        conn.execute(insert(scope_counts), [
            {"scope_id": scope_id, "state": state, "count": count,
             "oldest_accepted_at": oldest, "refreshed_at": now}
            for (scope_id, state), (count, oldest) in changed.items()])
    return len(changed) + len(gone)


def _hour_index(conn: Connection, column: Any) -> Any:
    """Return an SQL expression for whole hours since the epoch (UTC)."""
    if conn.dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", column) / 3600), Integer)
    return cast(func.strftime("%s", column), Integer) // 3600


def series_since(conn: Connection, since: datetime) -> dict[tuple[int, int], list[int]]:
    """Return {(scope_id, hour index): [accepted, failed]} for hours from `since`."""
    accepted_hour = _hour_index(conn, receipts.c.accepted_at)
    failed_at = func.coalesce(receipts.c.completed_at, receipts.c.accepted_at)
    failed_hour = _hour_index(conn, failed_at)
    series: dict[tuple[int, int], list[int]] = {}
    for scope_id, hour, count in conn.execute(
            select(receipts.c.scope_id, accepted_hour, func.count())
            .where(receipts.c.accepted_at >= since)
            .group_by(receipts.c.scope_id, accepted_hour)):
        series.setdefault((scope_id, int(hour)), [0, 0])[0] = int(count)
    for scope_id, hour, count in conn.execute(
            select(receipts.c.scope_id, failed_hour, func.count())
            .where(receipts.c.state == ReceiptState.FAILED.code, failed_at >= since)
            .group_by(receipts.c.scope_id, failed_hour)):
        series.setdefault((scope_id, int(hour)), [0, 0])[1] = int(count)
    return series


def refresh_hourly_series(conn: Connection, now: datetime, *, hours: int) -> int:
    """Recompute the newest `hours` hours and drop hours older than the window."""
    current = int(now.timestamp()) // 3600
    since = datetime.fromtimestamp((current - hours + 1) * 3600, UTC)
    window_start = datetime.fromtimestamp((current - SERIES_HOURS + 1) * 3600, UTC)
    series = series_since(conn, since)
    conn.execute(delete(hourly_series).where(hourly_series.c.hour >= since))
    conn.execute(delete(hourly_series).where(hourly_series.c.hour < window_start))
    if series:
        conn.execute(insert(hourly_series), [
            {"scope_id": scope_id, "hour": datetime.fromtimestamp(hour * 3600, UTC),
             "accepted": accepted, "failed": failed, "refreshed_at": now}
            for (scope_id, hour), (accepted, failed) in series.items()])
    return len(series)
