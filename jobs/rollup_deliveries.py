"""Refusals and intake latency per integration per hour, from the delivery log.

The delivery log (ledger/intake/delivery_log.py) only grows, in time order
give or take its buffering: a request's row is written within FLUSH_SECONDS of
its answer, and the refusals it counts instead of logging are written once
their minute ends, stamped with the minute. So a row's `at` is settled
DELIVERY_SETTLE_SECONDS after it (a minute, the flush, the body deadline and
room to spare); each run adds the rows whose `at` settled since the last run
to `hourly_refusals` (HTTP 4xx but 409, by integration: a refusal of an unknown
integration has none and is not attributed) and to `hourly_latency` (2xx and
409 answers per latency bucket, LATENCY_BOUNDS_US). Additions are upserts, so
a run reads and writes only what settled since the last one.

The rollup outlives the log's rows: a cell keeps its figures after the log's
retention purged them. A full recount (the first run, a pause longer than the
purge margin, a changed LEDGER_DELIVERY_LOG_SECONDS, once a day, or on demand)
therefore recounts only the hours the log still holds whole and keeps older
cells. Rows written later than the settle lag (a database outage kept them in
a web process's buffer) are counted by the next full recount.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, case, delete, func, select

from ledger.config import DEFAULT_DELIVERY_LOG_SECONDS
from ledger.db.engine import conflict_insert
from ledger.db.schema import (
    DELIVERY_HOURS_MARK,
    LATENCY_BOUNDS_US,
    deliveries,
    hourly_latency,
    hourly_refusals,
)

from .rollup_band import (
    HOUR,
    bucket_index,
    hour_bucket,
    hour_of,
    hour_spans,
    index_of,
    mark_to_step,
    settled_band,
    write_mark,
)
from .rollup_series import window_start

DELIVERY_SETTLE_SECONDS = 150
REFUSED = -1  # a refusal's bucket in this module's grouping (never stored)
ANSWERED_STATUSES = (200, 202, 409)
Cell = tuple[int, int, int]  # (scope id, hour index, latency bucket or REFUSED)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryHoursRun:
    """What one refresh did: cells upserted, delivery log rows read, full or not."""

    written: int
    rows_read: int
    full: bool


def latency_bucket(column: Any) -> Any:
    """Return an SQL expression for the LATENCY_BOUNDS_US bucket of a latency in µs."""
    return case(*((column <= bound, i) for i, bound in enumerate(LATENCY_BOUNDS_US)),
                else_=len(LATENCY_BOUNDS_US))


def refresh_delivery_hours(conn: Connection, now: datetime, *,
                           log_seconds: float = DEFAULT_DELIVERY_LOG_SECONDS,
                           full: bool = False) -> DeliveryHoursRun:
    """Add the delivery log rows that settled since the last run (all of them if `full`)."""
    band = settled_band(now, log_seconds, lag_seconds=DELIVERY_SETTLE_SECONDS)
    mark = mark_to_step(conn, DELIVERY_HOURS_MARK, band, now, full=full)
    window = window_start(now)
    if mark is None:
        # The hours no purge can have reached, never before the window.
        since = max(window, _next_hour(band.start))
        for table in (hourly_refusals, hourly_latency):
            conn.execute(delete(table).where(table.c.hour >= since))
        recounted_at, full = now, True
    else:
        since, recounted_at = max(mark.band.end, window), mark.recounted_at
    written = read = 0
    # One hour of the log per statement: a full recount of 7 days stays inside the timeout.
    for lo, hi in hour_spans(since, band.end, now) if full else [(since, band.end)]:
        assert hi is not None
        cells, n = _settled_rows(conn, lo, hi)
        written, read = written + _add(conn, cells), read + n
    for table in (hourly_refusals, hourly_latency):
        conn.execute(delete(table).where(table.c.hour < window))
    write_mark(conn, DELIVERY_HOURS_MARK, band, now, recounted_at)
    return DeliveryHoursRun(written=written, rows_read=read, full=full)


def _next_hour(when: datetime) -> datetime:
    """Return the first hour that starts at or after `when`."""
    start = hour_of(index_of(when))
    return start if start == when else start + HOUR


def settled_rows_stmt(conn: Connection, since: datetime, until: datetime) -> Select[Any]:
    """The log's rows with `at` in [since, until) per integration, hour and bucket.

    A range of ix_deliveries_at: what settled since the last run, not the log.
    """
    status = deliveries.c.http_status
    bucket = case((status.in_(ANSWERED_STATUSES) & deliveries.c.latency_us.is_not(None),
                   latency_bucket(deliveries.c.latency_us)),
                  ((status >= 400) & (status < 500) & (status != 409), REFUSED), else_=None)
    hour = hour_bucket(conn, deliveries.c.at)
    return (select(deliveries.c.integration_id, hour, bucket, func.sum(deliveries.c.count),
                   func.count())
            .where(deliveries.c.at >= since, deliveries.c.at < until,
                   deliveries.c.integration_id.is_not(None))
            .group_by(deliveries.c.integration_id, hour, bucket))


def _settled_rows(conn: Connection, since: datetime,
                  until: datetime) -> tuple[dict[Cell, int], int]:
    """Return {(scope, hour, bucket or REFUSED): deliveries} for `at` in [since, until)."""
    if since >= until:
        return {}, 0
    cells: dict[Cell, int] = {}
    read = 0
    for scope_id, h, b, n, logged in conn.execute(settled_rows_stmt(conn, since, until)):
        read += int(logged)
        if b is not None:
            cells[(scope_id, bucket_index(h), int(b))] = int(n)
    return cells, read


def _add(conn: Connection, cells: dict[Cell, int]) -> int:
    """Add the counts to their cells (upserts); return how many cells were written."""
    refused = [{"scope_id": s, "hour": hour_of(h), "refused": n}
               for (s, h, b), n in cells.items() if b == REFUSED]
    latency = [{"scope_id": s, "hour": hour_of(h), "bucket": b, "deliveries": n}
               for (s, h, b), n in cells.items() if b != REFUSED]
    if refused:
        stmt = conflict_insert(conn, hourly_refusals)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=["scope_id", "hour"],
            set_={"refused": hourly_refusals.c.refused + stmt.excluded.refused}), refused)
    if latency:
        stmt = conflict_insert(conn, hourly_latency)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=["scope_id", "hour", "bucket"],
            set_={"deliveries": hourly_latency.c.deliveries + stmt.excluded.deliveries}),
            latency)
    return len(refused) + len(latency)
