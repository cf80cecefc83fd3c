"""Stuck work and terminal failures: what on-call looks at first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Label, func, select, tuple_

from ledger.db.schema import attempts, findings, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.reads.cursor import Page, decode_cursor, encode_cursor
from ledger.reads.models import (
    FailureItem,
    FindingItem,
    OrphanReceiptItem,
    OverdueItem,
    PendingReceiptItem,
    RetryingItem,
    RunningItem,
    StuckItem,
)
from ledger.reads.receipts import (
    LIST_COLUMNS,
    MAX_LIMIT,
    ReceiptFilter,
    before_key,
    failure_item,
    filter_terms,
    newest_first,
    receipt_item,
    scope_names,
    time_cursor,
)

STUCK_LIMIT = 100
# A queued work item due for longer than this is stuck: its lease expired, or no worker
# claimed it. An idle worker polls twice a second, so such a one was not merely
# waiting for the next poll; the grace keeps a busy moment off the stuck list.
STUCK_GRACE_SECONDS = 30
# Counts shown to operators stop here: an exact count of a huge set costs a scan.
COUNT_CAP = 100_000


def _last_error() -> Label[Any]:
    """Return a scalar subquery: the newest attempt's error of the outer receipt."""
    return (select(attempts.c.error)
            .where(attempts.c.scope_id == receipts.c.scope_id,
                   attempts.c.event_id == receipts.c.event_id,
                   attempts.c.error.is_not(None))
            .order_by(attempts.c.number.desc(), attempts.c.id.desc())
            .limit(1).correlate(receipts).scalar_subquery().label("last_error"))


def failures_filter(f: ReceiptFilter) -> ReceiptFilter:
    """Return the filter restricted to failed receipts."""
    return ReceiptFilter(scope_id=f.scope_id, scope_ids=f.scope_ids, state=ReceiptState.FAILED,
                         event_type=f.event_type, since=f.since, until=f.until)


def list_failures(conn: Connection, f: ReceiptFilter, *, cursor: str | None = None,
                  limit: int = 50) -> Page[FailureItem]:
    """Return one page of failed receipts with their last error, newest first."""
    limit = max(1, min(limit, MAX_LIMIT))
    f = failures_filter(f)
    key = time_cursor(cursor)
    terms = filter_terms(f) + (before_key(key) if key else [])
    rows = conn.execute(newest_first(select(*LIST_COLUMNS, _last_error()).where(*terms))
                        .limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    names = scope_names(conn, {r.scope_id for r in rows})
    items = [failure_item(r, names) for r in rows]
    next_cursor = (encode_cursor(rows[-1].accepted_at, rows[-1].scope_id, rows[-1].event_id)
                   if more else None)
    return Page(items=items, next_cursor=next_cursor)


def count_failures(conn: Connection, f: ReceiptFilter) -> tuple[int, bool]:
    """Count failed receipts matching the filter, up to COUNT_CAP; tell whether capped."""
    inner = (select(receipts.c.event_id).where(*filter_terms(failures_filter(f)))
             .limit(COUNT_CAP + 1).subquery())
    count = int(conn.execute(select(func.count()).select_from(inner)).scalar_one())
    return min(count, COUNT_CAP), count > COUNT_CAP


def failures_chunk(conn: Connection, f: ReceiptFilter, after: tuple[datetime, int, str] | None,
                   size: int) -> list[tuple[datetime, int, str]]:
    """Return the next `size` failed receipts' keys oldest first, after `after`."""
    terms = filter_terms(failures_filter(f))
    if after is not None:
        terms += [receipts.c.accepted_at >= after[0],
                  tuple_(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id)
                  > tuple_(*after)]
    rows = conn.execute(
        select(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id)
        .where(*terms)
        .order_by(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id)
        .limit(size)).all()
    return [(r.accepted_at, r.scope_id, r.event_id) for r in rows]


def stuck_pending(conn: Connection, now: datetime,
                  threshold_seconds: float) -> list[PendingReceiptItem]:
    """Return the oldest receipts still pending past the threshold (partial index)."""
    cutoff = now - timedelta(seconds=threshold_seconds)
    rows = conn.execute(
        select(*LIST_COLUMNS).where(receipts.c.state == ReceiptState.PENDING.code,
                                    receipts.c.state != ReceiptState.COMPLETE.code,
                                    receipts.c.accepted_at < cutoff)
        .order_by(receipts.c.accepted_at).limit(STUCK_LIMIT)).all()
    names = scope_names(conn, {r.scope_id for r in rows})
    return [PendingReceiptItem(**receipt_item(r, names),
                               age_seconds=(now - r.accepted_at).total_seconds())
            for r in rows]


def overdue_work(conn: Connection, now: datetime, grace_seconds: int) -> list[OverdueItem]:
    """Return queued work items due for longer than the grace: expired leases, unclaimed work."""
    cutoff = now - timedelta(seconds=grace_seconds)
    rows = conn.execute(
        select(jobs.c.scope_id, jobs.c.event_id, jobs.c.event_type, jobs.c.accepted_at,
               jobs.c.run_at, jobs.c.attempts, jobs.c.leased_by, jobs.c.leased_until)
        .where(jobs.c.status == JobStatus.QUEUED.value, jobs.c.run_at <= cutoff)
        .order_by(jobs.c.run_at).limit(STUCK_LIMIT)).all()
    names = scope_names(conn, {r.scope_id for r in rows})
    items = []
    for r in rows:
        scope, public_id = names.get(r.scope_id, (str(r.scope_id), ""))
        expired = r.leased_until is not None and r.leased_until <= now
        items.append(OverdueItem(
            scope_id=r.scope_id, event_id=r.event_id, event_type=r.event_type,
            accepted_at=r.accepted_at, run_at=r.run_at, attempts=r.attempts,
            leased_by=r.leased_by, leased_until=r.leased_until, scope=scope,
            integration=public_id, kind="expired lease" if expired else "due, unclaimed",
            age_seconds=(now - r.accepted_at).total_seconds(),
            overdue_seconds=(now - r.run_at).total_seconds()))
    return items


def open_findings(conn: Connection, limit: int = STUCK_LIMIT) -> list[FindingItem]:
    """Return unresolved findings of the scheduled checks, newest first."""
    rows = conn.execute(select(findings).where(findings.c.resolved_at.is_(None))
                        .order_by(findings.c.last_seen.desc()).limit(limit))
    return [FindingItem(id=r.id, kind=r.kind, subject=r.subject, detail=r.detail,
                        first_seen=r.first_seen, last_seen=r.last_seen,
                        resolved_at=r.resolved_at) for r in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckWork:
    """Stuck work with its reason, retrying work apart from it, and open findings.

    `pending` and `overdue_jobs` (the API's key) are the older, reason-less lists it keeps.
    """

    stuck: list[StuckItem | OrphanReceiptItem]  # each with `reason` (ledger.reads.stuck)
    retrying: list[RetryingItem]  # attempt n of N, next attempt, last error
    live_workers: int
    running: list[RunningItem]  # held now: worker, running for, lease left
    pending: list[PendingReceiptItem]
    overdue_jobs: list[OverdueItem]
    findings: list[FindingItem]
    threshold_seconds: float  # pending longer than this is stuck
    grace_seconds: int  # a work item due longer than this is overdue


def read_stuck_work(conn: Connection, now: datetime, *, threshold_seconds: float,
                    max_attempts: int = 8, live_within: float = 30) -> StuckWork:
    """Return what on-call looks at first: stuck work and why, retrying work, findings."""
    from ledger.reads import stuck

    live = stuck.live_workers(conn, now, within_seconds=live_within)
    grace = STUCK_GRACE_SECONDS
    stuck_items: list[StuckItem | OrphanReceiptItem] = [
        *stuck.stuck_work_items(conn, now, grace_seconds=grace, max_attempts=max_attempts,
                                live=live),
        *stuck.pending_without_work_item(conn, now, grace_seconds=grace)]
    return StuckWork(stuck=stuck_items,
                     retrying=stuck.retrying_work(conn, now, grace_seconds=grace,
                                                  max_attempts=max_attempts),
                     live_workers=len(live),
                     running=stuck.running_work(conn, now, live=live),
                     pending=stuck_pending(conn, now, threshold_seconds),
                     overdue_jobs=overdue_work(conn, now, grace),
                     findings=open_findings(conn), threshold_seconds=threshold_seconds,
                     grace_seconds=grace)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failures:
    """One page of failed receipts and how many match in all (capped at COUNT_CAP)."""

    page: Page[FailureItem]
    total: int
    capped: bool  # True when more than `total` match


def read_failures(conn: Connection, f: ReceiptFilter, *, cursor: str | None = None,
                  limit: int = 50, group: str | None = None) -> Failures:
    """Return a page of the failures matching the filter (and one failure group, if given),
    with their capped total."""
    if group is not None:
        from ledger.reads.groups import count_group

        total, capped = count_group(conn, f, group, cap=COUNT_CAP)
        return Failures(page=list_group_failures(conn, f, group, cursor=cursor, limit=limit),
                        total=total, capped=capped)
    page = list_failures(conn, f, cursor=cursor, limit=limit)
    total, capped = count_failures(conn, f)
    return Failures(page=page, total=total, capped=capped)


def list_group_failures(conn: Connection, f: ReceiptFilter, gid: str, *,
                        cursor: str | None = None, limit: int = 50) -> Page[FailureItem]:
    """Return one page of a failure group's receipts, in its index's order (scope, time)."""
    from ledger.reads.groups import group_chunk

    limit = max(1, min(limit, MAX_LIMIT))
    after = None if cursor is None else decode_cursor(cursor, (datetime, int, str))
    keys, _, found = group_chunk(conn, f, gid, after, limit + 1)
    keys = keys[:limit]
    rows = {(r.scope_id, r.event_id): r for r in conn.execute(
        select(*LIST_COLUMNS, _last_error()).where(
            tuple_(receipts.c.scope_id, receipts.c.event_id).in_([k[1:] for k in keys])))
    } if keys else {}
    names = scope_names(conn, {k[1] for k in keys})
    items = [failure_item(rows[k[1:]], names) for k in keys if k[1:] in rows]
    return Page(items=items, next_cursor=encode_cursor(*keys[-1]) if found > limit else None)
