"""Every SQL statement of the worker. Functions take `conn` and never commit.

Three short transactions make one attempt (ledger.worker opens them):
claim (lease + attempt row), complete (handler effects + receipt + job end),
and, when the handler raised, record the failure. The last two start with
`hold_lease`, the fencing check: a worker whose lease was taken over finds
its token gone and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, delete, insert, select, update

from ledger.domain import JobStatus, ReceiptState
from ledger.schema import attempts, jobs, receipts

ERROR_LIMIT = 500
LOST_ERROR = "WorkerLost: the lease expired before the attempt reported an outcome"


@dataclass(frozen=True, slots=True, kw_only=True)
class DueJob:
    """A claimable job as the claim query found it (still locked by the claim transaction)."""

    scope_id: int
    event_id: str
    event_type: str
    window_start: datetime  # jobs.accepted_at: acceptance, or the operator's last requeue
    attempts: int  # attempts started since the window opened
    lease_token: int
    payload: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedJob:
    """A job leased to one worker: the token fences every later write."""

    scope_id: int
    event_id: str
    event_type: str
    payload: str | None
    window_start: datetime
    accepted_at: datetime  # the receipt's acceptance: the event's age in logs
    attempt: int  # this attempt's place in the retry budget (1 = first since the window opened)
    number: int  # this attempt's number in the receipt's history (never reset)
    lease_token: int
    leased_until: datetime


def _job_key(scope_id: int, event_id: str) -> tuple[object, object]:
    """Return the WHERE clause naming one job."""
    return (jobs.c.scope_id == scope_id, jobs.c.event_id == event_id)


def _receipt_key(scope_id: int, event_id: str) -> tuple[object, object]:
    """Return the WHERE clause naming one receipt."""
    return (receipts.c.scope_id == scope_id, receipts.c.event_id == event_id)


def due_job_query(now: datetime) -> Select[Any]:
    """Return the claim query: the oldest due job that no other worker holds, locked."""
    return (
        select(jobs.c.scope_id, jobs.c.event_id, jobs.c.event_type, jobs.c.accepted_at,
               jobs.c.attempts, jobs.c.lease_token, jobs.c.payload)
        # Queued only: failed jobs (status 1) wait for an operator. This is also
        # the predicate of the partial index ix_jobs_due, so the planner uses it.
        .where(jobs.c.status == JobStatus.QUEUED.value)
        # Due: new work, a retry whose backoff has passed, or a lease that expired
        # (a claim sets run_at to the lease's end, so no separate lease test).
        .where(jobs.c.run_at <= now)
        # Oldest first, in index order: fair, and no sort step.
        .order_by(jobs.c.run_at)
        # One job per claim: a worker never sits on work it cannot start.
        .limit(1)
        # FOR UPDATE: the row stays ours until the lease is written and committed.
        # SKIP LOCKED: other workers take the next row instead of queueing behind
        # ours. SQLite ignores both; its BEGIN IMMEDIATE already serialises claims.
        .with_for_update(skip_locked=True)
    )


def select_due_job(conn: Connection, now: datetime) -> DueJob | None:
    """Find and lock the oldest due job that no other worker holds."""
    row = conn.execute(due_job_query(now)).first()
    if row is None:
        return None
    return DueJob(scope_id=row.scope_id, event_id=row.event_id, event_type=row.event_type,
                  window_start=row.accepted_at, attempts=row.attempts,
                  lease_token=row.lease_token, payload=row.payload)


def lease_job(conn: Connection, due: DueJob, *, worker_id: str, now: datetime,
              lease_seconds: int) -> ClaimedJob | None:
    """Lease the job with a new fencing token and open its attempt row.

    The attempt is counted here, before the handler runs, so a job that keeps
    killing its workers still runs out of attempts. None if the receipt is gone.
    """
    counted = conn.execute(
        update(receipts).where(*_receipt_key(due.scope_id, due.event_id))
        .values(attempts=receipts.c.attempts + 1)
        .returning(receipts.c.attempts, receipts.c.accepted_at)
    ).first()
    if counted is None:
        return None
    token = due.lease_token + 1
    leased_until = now + timedelta(seconds=lease_seconds)
    conn.execute(
        update(jobs).where(*_job_key(due.scope_id, due.event_id))
        .values(attempts=jobs.c.attempts + 1, lease_token=token, leased_by=worker_id,
                leased_until=leased_until, run_at=leased_until)
    )
    if due.attempts > 0:
        mark_lost_attempts(conn, due.scope_id, due.event_id, now)
    conn.execute(insert(attempts).values(
        scope_id=due.scope_id, event_id=due.event_id, number=counted.attempts,
        worker_id=worker_id, lease_token=token, started_at=now))
    return ClaimedJob(
        scope_id=due.scope_id, event_id=due.event_id, event_type=due.event_type,
        payload=due.payload, window_start=due.window_start, accepted_at=counted.accepted_at,
        attempt=due.attempts + 1, number=counted.attempts, lease_token=token,
        leased_until=leased_until)


def mark_lost_attempts(conn: Connection, scope_id: int, event_id: str, now: datetime) -> None:
    """Close attempts whose worker vanished: their lease expired without an outcome."""
    conn.execute(
        update(attempts)
        .where(attempts.c.scope_id == scope_id, attempts.c.event_id == event_id,
               attempts.c.finished_at.is_(None))
        .values(finished_at=now, outcome="lost", error=LOST_ERROR)
    )


def set_job_failed(conn: Connection, scope_id: int, event_id: str) -> None:
    """Park a job for review: status failed, payload kept."""
    conn.execute(
        update(jobs).where(*_job_key(scope_id, event_id))
        .values(status=JobStatus.FAILED.value, leased_by=None, leased_until=None)
    )


def fail_unstarted(conn: Connection, due: DueJob, *, worker_id: str, reason: str,
                   now: datetime) -> int | None:
    """Make the receipt failed without running the attempt; return the receipt's attempts."""
    if due.attempts > 0:
        mark_lost_attempts(conn, due.scope_id, due.event_id, now)
    started = conn.execute(
        update(receipts).where(*_receipt_key(due.scope_id, due.event_id))
        .values(state=ReceiptState.FAILED.code, completed_at=now)
        .returning(receipts.c.attempts)
    ).scalar()
    set_job_failed(conn, due.scope_id, due.event_id)
    if started is None:
        return None
    # A "not-run" row carries the reason, so `receipt show` explains the failure.
    conn.execute(insert(attempts).values(
        scope_id=due.scope_id, event_id=due.event_id, number=int(started) + 1,
        worker_id=worker_id, lease_token=due.lease_token, started_at=now, finished_at=now,
        outcome="not-run", error=reason[:ERROR_LIMIT]))
    return int(started)


def hold_lease(conn: Connection, job: ClaimedJob) -> bool:
    """Lock the job if our fencing token is still current (the first statement of a write).

    PostgreSQL: FOR UPDATE makes a concurrent claim skip the row until we commit,
    and waits out a claim in flight, then re-reads the token. SQLite: the
    transaction's BEGIN IMMEDIATE write lock already excludes every other writer.
    """
    row = conn.execute(
        select(jobs.c.lease_token)
        .where(*_job_key(job.scope_id, job.event_id), jobs.c.lease_token == job.lease_token,
               jobs.c.status == JobStatus.QUEUED.value)
        .with_for_update()
    ).first()
    return row is not None


def finish_attempt(conn: Connection, job: ClaimedJob, *, outcome: str, now: datetime,
                   error: str | None = None) -> None:
    """Record how this attempt ended."""
    conn.execute(
        update(attempts)
        .where(attempts.c.scope_id == job.scope_id, attempts.c.event_id == job.event_id,
               attempts.c.number == job.number, attempts.c.lease_token == job.lease_token)
        .values(finished_at=now, outcome=outcome,
                error=error[:ERROR_LIMIT] if error is not None else None)
    )


def complete_job(conn: Connection, job: ClaimedJob, *, result_ref: str, now: datetime) -> None:
    """Mark the receipt complete and end the job; its payload leaves the hot ledger."""
    conn.execute(
        update(receipts).where(*_receipt_key(job.scope_id, job.event_id))
        .values(state=ReceiptState.COMPLETE.code, completed_at=now, result_ref=result_ref)
    )
    conn.execute(delete(jobs).where(*_job_key(job.scope_id, job.event_id)))
    finish_attempt(conn, job, outcome="complete", now=now)


def schedule_retry(conn: Connection, job: ClaimedJob, *, run_at: datetime) -> None:
    """Release the lease and make the job due again at `run_at`."""
    conn.execute(
        update(jobs).where(*_job_key(job.scope_id, job.event_id))
        .values(run_at=run_at, leased_by=None, leased_until=None)
    )


def fail_job(conn: Connection, job: ClaimedJob, *, now: datetime) -> None:
    """Make the receipt failed (terminal, reviewable); the job keeps its payload for review."""
    conn.execute(
        update(receipts).where(*_receipt_key(job.scope_id, job.event_id))
        .values(state=ReceiptState.FAILED.code, completed_at=now)
    )
    set_job_failed(conn, job.scope_id, job.event_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedJob:
    """A failed job as an operator sees it before a requeue."""

    payload: str | None
    status: int
    window_start: datetime  # the retention purge drops a failed payload a review window later


def lock_job(conn: Connection, scope_id: int, event_id: str) -> ParkedJob | None:
    """Lock one job row for an operator action; None if it no longer exists."""
    row = conn.execute(
        select(jobs.c.payload, jobs.c.status, jobs.c.accepted_at)
        .where(*_job_key(scope_id, event_id)).with_for_update()
    ).first()
    if row is None:
        return None
    return ParkedJob(payload=row.payload, status=row.status, window_start=row.accepted_at)


def requeue_job(conn: Connection, scope_id: int, event_id: str, now: datetime) -> None:
    """Queue a failed job again, due now, with a fresh retry window (history is kept)."""
    conn.execute(
        update(jobs).where(*_job_key(scope_id, event_id))
        .values(status=JobStatus.QUEUED.value, run_at=now, accepted_at=now, attempts=0,
                leased_by=None, leased_until=None)
    )
    conn.execute(
        update(receipts).where(*_receipt_key(scope_id, event_id))
        .values(state=ReceiptState.PENDING.code, completed_at=None)
    )
