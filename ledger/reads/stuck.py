"""Honest stuck work: a work item merely retrying is not stuck, and a stuck one says why.

*Retrying*: a queued work item that failed at least once and waits on its backoff (or is
due within the grace): attempt n of N, the next attempt's time, the last error.
*Stuck*, with the reason in a column:
  - no live worker: work is due and no worker instance has a heartbeat within the bound;
  - held by live worker X past its lease: its handler still runs (a heartbeat within
    the bound) beyond the lease, so nothing else may take the work item;
  - lease expired, not retaken: a worker took the work item and went silent past the grace;
  - due, unclaimed: due for longer than the grace and no worker took it;
  - pending without a job: the receipt waits but no queued work item exists to run it
    (the reason keeps the API's wording).
Ages count from the work item's retry window (acceptance, or an operator's last requeue),
so a requeued receipt is not aged from its first acceptance.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Label, Select, and_, select

from ledger.db.schema import attempts, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.reads.models import (
    OrphanReceiptItem,
    QueuedWorkItem,
    RetryingItem,
    RunningItem,
    StuckItem,
)
from ledger.reads.receipts import scope_names
from ledger.scheduling.instances import InstanceKind, live_instances

LIST_LIMIT = 100
# Only the oldest pending receipts are checked for a missing work item: a bounded probe.
ORPHAN_PROBE = 1000
NO_WORKER = "no live worker"
EXPIRED_LEASE = "lease expired, not retaken"
UNCLAIMED = "due, unclaimed"
NO_JOB = "pending without a job"
HELD_PAST_LEASE = "held by live worker {worker} past its lease"
# "Running now" looks back this far for leases that ended: a work item held longer past its
# lease than this still shows under Stuck, with its reason.
RUNNING_LOOKBACK = timedelta(hours=1)

# The receipt's first acceptance, looked up per listed work item by primary key: a join
# would let the planner hash all of receipts for a page of 100 work items.
_FIRST_ACCEPTED = (select(receipts.c.accepted_at)
                   .where(receipts.c.scope_id == jobs.c.scope_id,
                          receipts.c.event_id == jobs.c.event_id)
                   .correlate(jobs).scalar_subquery().label("accepted_at"))
_WORK_COLUMNS = (jobs.c.scope_id, jobs.c.event_id, jobs.c.event_type, jobs.c.run_at,
                jobs.c.attempts, jobs.c.leased_by, jobs.c.leased_until,
                jobs.c.accepted_at.label("window_start"), _FIRST_ACCEPTED)


def _last_error() -> Label[Any]:
    """Return a scalar subquery: the newest attempt's error of the outer work item."""
    return (select(attempts.c.error)
            .where(attempts.c.scope_id == jobs.c.scope_id,
                   attempts.c.event_id == jobs.c.event_id, attempts.c.error.is_not(None))
            .order_by(attempts.c.number.desc(), attempts.c.id.desc())
            .limit(1).correlate(jobs).scalar_subquery().label("last_error"))


def _item(row: Any, names: Mapping[int, tuple[str, str]], now: datetime,
          max_attempts: int) -> QueuedWorkItem:
    """Turn a work item's row into what the page shows."""
    scope, public_id = names.get(row.scope_id, (str(row.scope_id), ""))
    return QueuedWorkItem(
        scope_id=row.scope_id, event_id=row.event_id, event_type=row.event_type,
        run_at=row.run_at, attempts=row.attempts, leased_by=row.leased_by,
        leased_until=row.leased_until, window_start=row.window_start,
        accepted_at=row.accepted_at, last_error=row.last_error, scope=scope,
        integration=public_id, max_attempts=max_attempts,
        window_age_seconds=(now - row.window_start).total_seconds(),
        requeued=row.accepted_at is not None and row.window_start > row.accepted_at)


def retrying_work(conn: Connection, now: datetime, *, grace_seconds: float,
                  max_attempts: int) -> list[RetryingItem]:
    """Return queued work items that failed before and wait on their backoff, soonest first."""
    rows = conn.execute(
        select(*_WORK_COLUMNS, _last_error())
        .where(jobs.c.status == JobStatus.QUEUED.value,
               jobs.c.run_at > now - timedelta(seconds=grace_seconds),
               jobs.c.attempts >= 1, jobs.c.leased_by.is_(None))
        .order_by(jobs.c.run_at).limit(LIST_LIMIT)).all()
    names = scope_names(conn, {r.scope_id for r in rows})
    return [RetryingItem(**_item(r, names, now, max_attempts),
                         next_in_seconds=(r.run_at - now).total_seconds()) for r in rows]


def _stuck_reason(row: Any, now: datetime, *, live: frozenset[str]) -> str:
    """Return why a due work item is stuck."""
    if row.leased_by is not None and row.leased_by in live:
        return HELD_PAST_LEASE.format(worker=row.leased_by)
    if not live:
        return NO_WORKER
    if row.leased_by is not None and row.leased_until is not None and row.leased_until <= now:
        return EXPIRED_LEASE
    return UNCLAIMED


def stuck_work_items(conn: Connection, now: datetime, *, grace_seconds: float, max_attempts: int,
               live: frozenset[str]) -> list[StuckItem]:
    """Return due work items nobody else may run: past the grace, or due at all with no worker."""
    cutoff = now if not live else now - timedelta(seconds=grace_seconds)
    rows = conn.execute(
        select(*_WORK_COLUMNS, _last_error())
        .where(jobs.c.status == JobStatus.QUEUED.value, jobs.c.run_at <= cutoff)
        .order_by(jobs.c.run_at).limit(LIST_LIMIT)).all()
    names = scope_names(conn, {r.scope_id for r in rows})
    return [StuckItem(**_item(r, names, now, max_attempts),
                      reason=_stuck_reason(r, now, live=live),
                      overdue_seconds=(now - r.run_at).total_seconds()) for r in rows]


def pending_without_work_item(conn: Connection, now: datetime, *,
                        grace_seconds: float) -> list[OrphanReceiptItem]:
    """Return pending receipts (among the oldest ORPHAN_PROBE) with no queued work item."""
    oldest = (select(receipts.c.scope_id, receipts.c.event_id, receipts.c.event_type,
                     receipts.c.accepted_at, receipts.c.attempts)
              .where(receipts.c.state == ReceiptState.PENDING.code,
                     receipts.c.state != ReceiptState.COMPLETE.code,  # the partial index
                     receipts.c.accepted_at < now - timedelta(seconds=grace_seconds))
              .order_by(receipts.c.accepted_at).limit(ORPHAN_PROBE).subquery())
    queued = and_(jobs.c.scope_id == oldest.c.scope_id, jobs.c.event_id == oldest.c.event_id,
                  jobs.c.status == JobStatus.QUEUED.value)
    rows = conn.execute(
        select(oldest).outerjoin(jobs, queued).where(jobs.c.event_id.is_(None))
        .order_by(oldest.c.accepted_at).limit(LIST_LIMIT)).all()
    names = scope_names(conn, {r.scope_id for r in rows})
    items = []
    for r in rows:
        scope, public_id = names.get(r.scope_id, (str(r.scope_id), ""))
        items.append(OrphanReceiptItem(
            scope_id=r.scope_id, event_id=r.event_id, event_type=r.event_type,
            accepted_at=r.accepted_at, attempts=r.attempts, scope=scope, integration=public_id,
            reason=NO_JOB, window_age_seconds=(now - r.accepted_at).total_seconds(),
            requeued=False, run_at=None, leased_by=None, last_error=None))
    return items


def live_workers(conn: Connection, now: datetime, *, within_seconds: float) -> frozenset[str]:
    """Return the ids of the worker instances with a heartbeat within the bound."""
    return frozenset(i.id for i in live_instances(conn, now=now, within_seconds=within_seconds,
                                                  kind=InstanceKind.WORKER))


def _started() -> Label[Any]:
    """Return a scalar subquery: when the outer work item's newest attempt started."""
    return (select(attempts.c.started_at)
            .where(attempts.c.scope_id == jobs.c.scope_id,
                   attempts.c.event_id == jobs.c.event_id)
            .order_by(attempts.c.number.desc(), attempts.c.id.desc())
            .limit(1).correlate(jobs).scalar_subquery().label("started_at"))


def running_stmt(now: datetime) -> Select[Any]:
    """Leased work items whose lease ended at most RUNNING_LOOKBACK ago: ix_jobs_due's range."""
    return (select(jobs.c.scope_id, jobs.c.event_id, jobs.c.event_type, jobs.c.attempts,
                   jobs.c.leased_by, jobs.c.leased_until, _started())
            .where(jobs.c.status == JobStatus.QUEUED.value,
                   jobs.c.run_at > now - RUNNING_LOOKBACK, jobs.c.leased_by.is_not(None))
            .order_by(jobs.c.run_at).limit(LIST_LIMIT))


def running_work(conn: Connection, now: datetime, *,
                 live: frozenset[str]) -> list[RunningItem]:
    """Return the work items a worker holds now: event, worker, running for, lease left.

    A claim pushes run_at to the lease's end, so held work items are found in ix_jobs_due's
    range from RUNNING_LOOKBACK ago on; a lease whose worker is gone is not running.
    """
    rows = conn.execute(running_stmt(now)).all()
    held = [r for r in rows if r.leased_by in live
            or (r.leased_until is not None and r.leased_until > now)]
    names = scope_names(conn, {r.scope_id for r in held})
    items = []
    for r in held:
        scope, public_id = names.get(r.scope_id, (str(r.scope_id), ""))
        left = (r.leased_until - now).total_seconds() if r.leased_until else None
        items.append(RunningItem(
            scope_id=r.scope_id, event_id=r.event_id, event_type=r.event_type,
            attempts=r.attempts, leased_by=r.leased_by, leased_until=r.leased_until,
            started_at=r.started_at, scope=scope, integration=public_id,
            worker_alive=r.leased_by in live, lease_left_seconds=left,
            running_seconds=(now - r.started_at).total_seconds() if r.started_at else None))
    return items
