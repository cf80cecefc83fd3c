"""The overview: rollups per scope, live headline numbers, instances and scheduled runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select

from ledger.db.schema import (
    ROLLUP_MARK,
    conflicts,
    hourly_series,
    instances,
    jobs,
    receipts,
    rollup_marks,
    scheduler_runs,
    scope_counts,
)
from ledger.domain import JobStatus, ReceiptState
from ledger.reads.admin import list_integrations
from ledger.reads.cursor import Page
from ledger.reads.models import Headline, InstanceRow, SchedulerRun
from ledger.scheduling.instances import InstanceKind, handled_types

HEADLINE_CAP = 100_000
SERIES_HOURS = 48
INSTANCE_LIMIT = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Overview:
    """What the overview shows: headline numbers, a page of scopes, instances, scheduled runs."""

    headline: Headline
    scopes: Page
    rollups_refreshed_at: datetime | None  # the age of the scopes' counts
    instances: list[InstanceRow]  # each with `live`: a beat within the bound
    live_counts: dict[str, int]  # live instances per kind: web, worker, scheduler
    work_due: bool  # a queued work item is due now
    scheduler_runs: list[SchedulerRun]

    @property
    def no_live_worker(self) -> bool:
        """Tell whether work is due and no worker is alive to take it (the banner)."""
        return self.work_due and not self.live_counts.get(InstanceKind.WORKER, 0)


def read_overview(conn: Connection, now: datetime, *, live_within: float,
                  cursor: str | None = None) -> Overview:
    """Return the overview with one page of scopes (BadCursor for a cursor we did not make).

    An instance is live when its heartbeat is at most `live_within` seconds old.
    """
    scopes, refreshed = scope_rows(conn, now, cursor=cursor)
    rows = instance_rows(conn, now, live_within=live_within)
    return Overview(headline=headline(conn, now), scopes=scopes, rollups_refreshed_at=refreshed,
                    instances=rows, live_counts=live_counts(rows),
                    work_due=work_due(conn, now), scheduler_runs=last_runs(conn))


def _capped_count(conn: Connection, stmt: Any) -> int:
    """Count the rows of a select, stopping at HEADLINE_CAP + 1."""
    inner = stmt.limit(HEADLINE_CAP + 1).subquery()
    return int(conn.execute(select(func.count()).select_from(inner)).scalar_one())


def headline(conn: Connection, now: datetime) -> Headline:
    """Return the live numbers at the top of the overview (all through small indexes)."""
    day_ago = now - timedelta(hours=24)
    oldest = conn.execute(
        select(receipts.c.accepted_at)
        .where(receipts.c.state == ReceiptState.PENDING.code,
               receipts.c.state != ReceiptState.COMPLETE.code)
        .order_by(receipts.c.accepted_at).limit(1)).scalar()
    failed = _capped_count(conn, select(receipts.c.event_id).where(
        receipts.c.state == ReceiptState.FAILED.code,
        receipts.c.state != ReceiptState.COMPLETE.code, receipts.c.accepted_at >= day_ago))
    conflicted = _capped_count(conn, select(conflicts.c.id).where(
        conflicts.c.last_seen >= day_ago))
    return Headline(oldest_pending_at=oldest,
                    oldest_pending_age_seconds=(now - oldest).total_seconds() if oldest else None,
                    failures_24h=failed, conflicts_24h=conflicted, cap=HEADLINE_CAP)


def scope_rows(conn: Connection, now: datetime, *, cursor: str | None = None,
               limit: int = 20) -> tuple[Page, datetime | None]:
    """Return a page of scopes with rollup counts and hourly series, and the rollup time."""
    page = list_integrations(conn, cursor=cursor, limit=limit)
    ids = [item["id"] for item in page.items]
    if not ids:
        return page, None
    counts: dict[int, dict[str, Any]] = {i: {} for i in ids}
    refreshed: datetime | None = None
    for r in conn.execute(select(scope_counts).where(scope_counts.c.scope_id.in_(ids))):
        state = ReceiptState.from_code(r.state).value
        counts[r.scope_id][state] = r.count
        if r.state == ReceiptState.PENDING.code:
            counts[r.scope_id]["oldest_pending_at"] = r.oldest_accepted_at
        refreshed = r.refreshed_at if refreshed is None else max(refreshed, r.refreshed_at)
    if refreshed is not None:
        # jobs/rollups.py rewrites only the rows that change: its run's time is the mark's.
        refreshed = conn.execute(select(rollup_marks.c.counted_at).where(
            rollup_marks.c.name == ROLLUP_MARK)).scalar() or refreshed
    series: dict[int, list[tuple[datetime, int, int]]] = {i: [] for i in ids}
    since = now - timedelta(hours=SERIES_HOURS)
    for r in conn.execute(select(hourly_series)
                          .where(hourly_series.c.scope_id.in_(ids), hourly_series.c.hour >= since)
                          .order_by(hourly_series.c.scope_id, hourly_series.c.hour)):
        series[r.scope_id].append((r.hour, int(r.accepted), int(r.failed)))
    for item in page.items:
        item["counts"] = counts[item["id"]]
        item["series"] = series[item["id"]]
    return page, refreshed


def instance_rows(conn: Connection, now: datetime, *,
                  live_within: float) -> list[InstanceRow]:
    """Return the most recently alive instances with heartbeat age, liveness and key lag."""
    rows = conn.execute(select(instances).order_by(instances.c.heartbeat_at.desc())
                        .limit(INSTANCE_LIMIT))
    items: list[InstanceRow] = []
    for r in rows:
        lag = (now - r.credentials_refreshed_at).total_seconds() \
            if r.credentials_refreshed_at else None
        age = (now - r.heartbeat_at).total_seconds()
        handles = handled_types(r.handles)
        items.append(InstanceRow(
            id=r.id, kind=r.kind, hostname=r.hostname, pid=r.pid, started_at=r.started_at,
            heartbeat_at=r.heartbeat_at, credentials_refreshed_at=r.credentials_refreshed_at,
            handles=None if handles is None else list(handles),
            heartbeat_age_seconds=age, refresh_lag_seconds=lag, live=age <= live_within))
    return items


def live_counts(rows: list[InstanceRow]) -> dict[str, int]:
    """Count the live instances per kind (every kind present, zero included)."""
    counts = {kind.value: 0 for kind in InstanceKind}
    for row in rows:
        if row["live"]:
            counts[row["kind"]] = counts.get(row["kind"], 0) + 1
    return counts


def work_due(conn: Connection, now: datetime) -> bool:
    """Tell whether a queued work item is due (the partial due-jobs index, one row)."""
    return conn.execute(select(jobs.c.run_at).where(
        jobs.c.status == JobStatus.QUEUED.value, jobs.c.run_at <= now).limit(1)).first() \
        is not None


def last_runs(conn: Connection) -> list[SchedulerRun]:
    """Return the latest run of each scheduled job (the unique (job, period) index)."""
    names = conn.execute(select(scheduler_runs.c.job).distinct().order_by(scheduler_runs.c.job))
    items: list[SchedulerRun] = []
    for name in names.scalars().all():
        row = conn.execute(select(scheduler_runs).where(scheduler_runs.c.job == name)
                           .order_by(scheduler_runs.c.period_start.desc()).limit(1)).first()
        if row is not None:
            items.append(SchedulerRun(
                id=row.id, job=row.job, period_start=row.period_start, instance=row.instance,
                started_at=row.started_at, finished_at=row.finished_at, outcome=row.outcome,
                rows_affected=row.rows_affected, error=row.error, leased_until=row.leased_until))
    return items
