"""`hourly_series`, kept incrementally: accepted and failed per scope per hour, 7 days.

Accepted (by accepted_at) uses the same settled band as scope_totals
(jobs/rollup_band.py): each cell stores `settled`, its receipts inside the band,
and `accepted` = settled + its receipts on the band's two fresh edges (the
newest minute, and what is old enough to be purged). A run counts the receipts
that entered or left the band since the last run and the edges, and reads the
stored cells of the hours those touch only. Failed (by the time they failed; a
requeue lowers a closed hour) is counted each run from the failed receipts (the
partial index ix_receipts_open) and compared with the stored failed cells (the
partial index ix_hourly_series_failed) inside the database, which returns only the
cells that differ (at 10M receipts, 100,000 failed ones, reading every failed cell
into Python took 1.6 of the run's 2 s). Only cells whose figures changed are
written, and hours older than the window are dropped.

The repair is spread over the runs instead of a daily recount of the window (46 s at
10M receipts): every run also recounts one hour of the window whole,
the hour after the one the previous run recounted (`repair_hour`, kept in the mark;
after the current hour, back to the window's first). The cursor moves an hour a run
and the window an hour an hour, so while runs come less than an hour apart (a pause
over the purge margin counts the window anyway) it passes every hour of the window: at
one run a minute each hour is counted from the receipts again every ~171 runs (about
3 hours), and a drift (a receipt committed long after its accepted_at, or written by
hand) lasts no longer. The first run, a pause longer than the purge margin and a
changed retention count the whole window (`full=True` does it on demand).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    bindparam,
    cast,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    tuple_,
    union_all,
)

from ledger.config import DEFAULT_RETENTION_SECONDS
from ledger.db.schema import SERIES_MARK, hourly_series, hourly_totals, receipts
from ledger.domain import ReceiptState

from .rollup_band import (
    Band,
    bucket_index,
    flag,
    hour_bucket,
    hour_of,
    hour_spans,
    index_of,
    mark_to_step,
    settled_band,
    upsert,
    write_mark,
)

SERIES_HOURS = 7 * 24  # the overview charts 48 h; per-integration health shows 24 h and 7 days
Cell = tuple[int, int]  # (scope id, hour index)
Figures = tuple[int, int, int]  # (accepted, failed, settled)


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesRun:
    """What one hourly_series refresh did: cells written, receipts read, full or not.

    `receipts_read` counts what changed (and everything in a full count);
    `repair_read` the receipts of the hour an incremental run recounted whole.
    """

    written: int
    receipts_read: int
    full: bool
    repair_read: int = 0


def window_start(now: datetime) -> datetime:
    """Return the first hour of the window a run at `now` keeps."""
    return hour_of(index_of(now) - SERIES_HOURS + 1)


def repair_hour(last: int | None, now: datetime) -> int:
    """Return the hour index a run at `now` recounts whole: the one after `last` (the
    previous run's), or the window's first when that is outside the window."""
    first, current = index_of(window_start(now)), index_of(now)
    hour = first if last is None else last + 1
    return hour if first <= hour <= current else first


def _settled_from(band: Band, window: datetime) -> datetime:
    """Return where the band's cells start: never before the window."""
    return min(max(band.start, window), band.end)


def refresh_hourly_series(conn: Connection, now: datetime, *,
                          retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                          full: bool = False) -> SeriesRun:
    """Bring hourly_series up to `now`, counting only what changed unless `full`."""
    band = settled_band(now, retention_seconds)
    mark = mark_to_step(conn, SERIES_MARK, band, now, full=full, recount_seconds=None)
    window = window_start(now)
    start = _settled_from(band, window)
    repair_read, hour = 0, None
    if mark is None:
        stored = _stored(conn, window, None)
        counted, read = _count_window(conn, window, start, band.end)
        new = {cell: (0, 0) for cell in stored} | counted  # what is gone counts zero
        recounted_at, full = now, True
    else:
        prev_start = _settled_from(mark.band, window_start(mark.counted_at))
        edges = (max(prev_start, start), mark.band.end)
        stored = _stored(conn, window, edges)
        new, read = _step(conn, stored, window, Band(start=prev_start, end=mark.band.end),
                          Band(start=start, end=band.end))
        hour = repair_hour(mark.repaired_hour, now)
        if hour_of(hour) < edges[0] or hour >= index_of(edges[1]):  # an edge: loaded above
            recounted, repair_read = _count_hour(conn, hour, start, band.end)
            new |= {cell: (0, 0) for cell in stored if cell[1] == hour} | recounted
        else:  # inside the band: the database compares, only differences come back
            recounted, drifted, repair_read = _hour_changes(conn, hour, start, band.end)
            stored |= drifted
            new |= recounted
        recounted_at = mark.recounted_at
    failed, failed_read = _failed_changes(conn, window)
    stored |= _stored_cells(conn, [c for c in failed if c not in stored and c not in new])
    written, hours = _write_changed(conn, stored, new, failed, now)
    conn.execute(delete(hourly_series).where(hourly_series.c.hour < window))
    conn.execute(delete(hourly_totals).where(hourly_totals.c.hour < window))
    if full:
        hours = set(range(index_of(window), index_of(now) + 1))
    elif hour is not None:
        hours.add(hour)  # the repaired hour's totals too: whatever drifted is summed again
    retotal(conn, [hour_of(h) for h in sorted(hours) if h >= index_of(window)])
    write_mark(conn, SERIES_MARK, band, now, recounted_at, repaired_hour=hour)
    return SeriesRun(written=written, receipts_read=read + failed_read, full=full,
                     repair_read=repair_read)


def _cells(conn: Connection) -> Any:
    """Select the cells' keys and figures: the hour as its index (`_figures`)."""
    return select(hourly_series.c.scope_id, hour_bucket(conn, hourly_series.c.hour),
                  hourly_series.c.accepted, hourly_series.c.failed, hourly_series.c.settled)


def _figures(rows: Any) -> dict[Cell, Figures]:
    """Return {cell: (accepted, failed, settled)} of the rows `_cells` selects."""
    return {(scope_id, bucket_index(h)): (int(accepted), int(failed), int(settled))
            for scope_id, h, accepted, failed, settled in rows}


def _stored(conn: Connection, window: datetime,
            edges: tuple[datetime, datetime] | None) -> dict[Cell, Figures]:
    """Return the window's stored cells: all, or those of the edges' hours."""
    query = _cells(conn).where(hourly_series.c.hour >= window)
    if edges is not None:
        old_until, new_from = edges
        query = query.where(or_(hourly_series.c.hour < old_until,
                                hourly_series.c.hour >= hour_of(index_of(new_from))))
    return _figures(conn.execute(query))


def _stored_cells(conn: Connection, cells: list[Cell]) -> dict[Cell, Figures]:
    """Return the stored figures of the given cells (those that exist)."""
    if not cells:
        return {}
    keys = [(scope_id, hour_of(hour)) for scope_id, hour in cells]
    return _figures(conn.execute(_cells(conn).where(
        tuple_(hourly_series.c.scope_id, hourly_series.c.hour).in_(keys))))


def _count_hour(conn: Connection, hour: int, start: datetime, end: datetime
                ) -> tuple[dict[Cell, tuple[int, int]], int]:
    """Count one hour's receipts whole: {cell: (accepted, settled in [start, end))}, read."""
    at = receipts.c.accepted_at
    rows = _grouped(conn, (at >= hour_of(hour)) & (at < hour_of(hour + 1)),
                    (at >= start) & (at < end))
    return {cell: (n, settled) for cell, n, settled in rows}, sum(n for _, n, _ in rows)


def _hour_changes(conn: Connection, hour: int, start: datetime, end: datetime
                  ) -> tuple[dict[Cell, tuple[int, int]], dict[Cell, Figures], int]:
    """Recount one hour inside the band: ({cell: (accepted, settled)} where the stored
    cell differs or is missing, {cell: stored figures} of those, receipts read).

    The hour's receipts are counted per scope and compared with its stored cells in one
    statement (as `_failed_changes`), so an hour with no drift returns nothing to Python.
    """
    at, cell_hour = receipts.c.accepted_at, hour_of(hour)
    counted = (select(receipts.c.scope_id.label("scope_id"), func.count().label("n"),
                      func.sum(flag((at >= start) & (at < end))).label("m"))
               .where(at >= cell_hour, at < hour_of(hour + 1))
               .group_by(receipts.c.scope_id).cte("counted"))
    stored = (select(hourly_series.c.scope_id, hourly_series.c.accepted,
                     hourly_series.c.failed, hourly_series.c.settled)
              .where(hourly_series.c.hour == cell_hour).cte("stored_hour"))
    same = stored.c.scope_id == counted.c.scope_id
    m = func.coalesce(counted.c.m, 0)
    differ = (select(counted.c.scope_id, counted.c.n, m, stored.c.accepted, stored.c.failed,
                     stored.c.settled)
              .select_from(counted.outerjoin(stored, same))
              .where(or_(stored.c.scope_id.is_(None), stored.c.accepted != counted.c.n,
                         stored.c.settled != m)))
    gone = (select(stored.c.scope_id, literal(0, Integer), literal(0, Integer),
                   stored.c.accepted, stored.c.failed, stored.c.settled)
            .select_from(stored.outerjoin(counted, same))
            .where(counted.c.scope_id.is_(None),
                   or_(stored.c.accepted != 0, stored.c.settled != 0)))
    read = select(cast(null(), Integer), cast(func.coalesce(func.sum(counted.c.n), 0), Integer),
                  *(cast(null(), Integer) for _ in range(4)))
    changes: dict[Cell, tuple[int, int]] = {}
    drifted: dict[Cell, Figures] = {}
    total = 0
    rows: Any = conn.execute(union_all(differ, gone, read))
    for scope_id, n, settled, accepted, failed, was_settled in rows:
        if scope_id is None:
            total = int(n)
            continue
        cell = (int(scope_id), hour)
        changes[cell] = (int(n), int(settled))
        if accepted is not None:
            drifted[cell] = (int(accepted), int(failed), int(was_settled))
    return changes, drifted, total


def _grouped(conn: Connection, where: Any, moved: Any) -> list[tuple[Cell, int, int]]:
    """Return (cell, receipts, receipts where `moved`) for the receipts matching `where`."""
    hour = hour_bucket(conn, receipts.c.accepted_at)
    rows = conn.execute(select(receipts.c.scope_id, hour, func.count(), func.sum(flag(moved)))
                        .where(where).group_by(receipts.c.scope_id, hour))
    return [((scope_id, bucket_index(h)), int(n), int(m or 0)) for scope_id, h, n, m in rows]


def _count_window(conn: Connection, window: datetime, start: datetime,
                  end: datetime) -> tuple[dict[Cell, tuple[int, int]], int]:
    """Count every receipt of the window: {cell: (accepted, settled)}, receipts read."""
    at = receipts.c.accepted_at
    counted: dict[Cell, tuple[int, int]] = {}
    for lo, hi in hour_spans(window, None, end):  # one hour per statement
        span = (at >= lo) if hi is None else (at >= lo) & (at < hi)
        for cell, n, settled in _grouped(conn, span, (at >= start) & (at < end)):
            old = counted.get(cell, (0, 0))
            counted[cell] = (old[0] + n, old[1] + settled)
    return counted, sum(n for n, _ in counted.values())


def _step(conn: Connection, stored: dict[Cell, Figures], window: datetime, prev: Band,
          band: Band) -> tuple[dict[Cell, tuple[int, int]], int]:
    """Move the settled cells from `prev` to `band`; recount the edges fresh.

    Old edge [window, band.start): counted fresh; those at or after prev.start were
    settled and leave. New edge from prev.end: those before band.end enter, the rest
    are the fresh tail. A receipt that both enters and leaves (the band moved past
    prev.end) nets to zero, as in scope_totals. Every stored cell of the edges' hours
    is recomputed, so a fresh count that fell to zero is written too.
    """
    at = receipts.c.accepted_at
    old_until, new_from = index_of(max(prev.start, band.start)), index_of(prev.end)
    settled = {cell: figures[2] for cell, figures in stored.items()
               if cell[1] <= old_until or cell[1] >= new_from}
    fresh: dict[Cell, int] = {}
    read = 0
    for sign, where, moved in ((-1, (at >= window) & (at < band.start), at >= prev.start),
                               (1, at >= prev.end, at < band.end)):
        for cell, n, m in _grouped(conn, where, moved):
            read += n
            settled[cell] = settled.get(cell, 0) + sign * m
            fresh[cell] = fresh.get(cell, 0) + (n if sign < 0 else n - m)
    return {cell: (s + fresh.get(cell, 0), s) for cell, s in settled.items()}, read


def _failed_changes(conn: Connection, window: datetime) -> tuple[dict[Cell, int], int]:
    """Return {cell: failed receipts now} for the window's cells whose stored failed figure
    differs (0 where none are left), and how many failed receipts were read.

    Failed receipts are counted per scope and the hour they failed and joined with the
    stored cells that have failures in one statement: only the differences come back. On
    PostgreSQL a full join, both sides read from indexes alone (ix_receipts_open, migration
    0016; ix_hourly_series_failed, 0017); SQLite before 3.39 has no full join, so there the
    counted cells left-joined to the stored ones and the stored ones no count matches.
    """
    failed_at = func.coalesce(receipts.c.completed_at, receipts.c.accepted_at)
    hour = hour_bucket(conn, failed_at)
    counted = (select(receipts.c.scope_id.label("scope_id"), hour.label("h"),
                      func.count().label("n"))
               .where(receipts.c.state == ReceiptState.FAILED.code, failed_at >= window)
               .group_by(receipts.c.scope_id, hour).cte("counted"))
    stored = (select(hourly_series.c.scope_id.label("scope_id"),
                     hour_bucket(conn, hourly_series.c.hour).label("h"),
                     hourly_series.c.failed.label("failed"))
              .where(hourly_series.c.hour >= window, hourly_series.c.failed > 0)
              .cte("stored_failed"))
    same_cell = (stored.c.scope_id == counted.c.scope_id) & (stored.c.h == counted.c.h)
    full = conn.dialect.name == "postgresql"
    differ = [select(func.coalesce(counted.c.scope_id, stored.c.scope_id),
                     func.coalesce(counted.c.h, stored.c.h), func.coalesce(counted.c.n, 0))
              .select_from(counted.outerjoin(stored, same_cell, full=full))
              .where(stored.c.failed.is_distinct_from(counted.c.n))]
    if not full:  # the stored cells whose failures are all gone
        differ.append(select(stored.c.scope_id, stored.c.h, literal(0, Integer))
                      .select_from(stored.outerjoin(counted, same_cell))
                      .where(counted.c.n.is_(None)))
    read = select(cast(null(), Integer), null(),
                  cast(func.coalesce(func.sum(counted.c.n), 0), Integer))
    changes: dict[Cell, int] = {}
    total = 0
    for scope_id, h, n in conn.execute(union_all(*differ, read)):
        if scope_id is None:
            total = int(n)
        else:
            changes[(int(scope_id), bucket_index(h))] = int(n)
    return changes, total


def retotal(conn: Connection, hours: list[datetime]) -> None:
    """Sum hourly_series over its scopes into hourly_totals for each of `hours`."""
    for start in range(0, len(hours), 500):  # bound the IN list (SQLite's variables)
        chunk = hours[start:start + 500]
        sums = conn.execute(select(hourly_series.c.hour, func.sum(hourly_series.c.accepted),
                                   func.sum(hourly_series.c.failed))
                            .where(hourly_series.c.hour.in_(chunk))
                            .group_by(hourly_series.c.hour)).all()
        conn.execute(delete(hourly_totals).where(
            hourly_totals.c.hour.in_(set(chunk) - {h for h, _, _ in sums})))
        upsert(conn, hourly_totals, ["hour"], [
            {"hour": h, "accepted": int(a), "failed": int(f)} for h, a, f in sums])


def _write_changed(conn: Connection, stored: dict[Cell, Figures],
                   new: dict[Cell, tuple[int, int]], failed: dict[Cell, int],
                   now: datetime) -> tuple[int, set[int]]:
    """Write the cells whose figures changed (delete the emptied ones); return how many
    and the hours (indexes) they are in.

    `failed` holds only the cells whose failed figure changed; the others keep theirs.
    """
    changed: dict[Cell, Figures] = {}
    for cell in stored.keys() | new.keys() | failed.keys():
        old = stored.get(cell, (0, 0, 0))
        accepted, settled = new.get(cell, (old[0], old[2]))
        figures = (accepted, failed.get(cell, old[1]), settled)
        if figures != old:
            changed[cell] = figures
    emptied = [{"s": s, "h": hour_of(h)} for (s, h), figures in changed.items()
               if not any(figures) and (s, h) in stored]
    if emptied:
        conn.execute(delete(hourly_series).where(hourly_series.c.scope_id == bindparam("s"),
                                                 hourly_series.c.hour == bindparam("h")),
                     emptied)
    upsert(conn, hourly_series, ["scope_id", "hour"], [
        {"scope_id": s, "hour": hour_of(h), "accepted": a, "failed": f, "settled": st,
         "refreshed_at": now} for (s, h), (a, f, st) in changed.items() if a or f or st])
    return len(changed), {h for _, h in changed}
