"""The scheduler_runs table: one row per (job, period), written by whoever won the period.

The unique constraint on (job, period_start) is what makes a job run once per
period across every scheduler instance: the instance whose INSERT lands runs
the job, the others see the conflict and skip. A 'running' row carries a lease
(`leased_until`) that its holder renews while the job runs; once it runs out the
holder is taken as dead and the run is marked abandoned. Functions take `conn`
and never commit.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import Connection, and_, exists, or_, select, update

from ledger.db.engine import conflict_insert
from ledger.db.schema import scheduler_runs

ERROR_TEXT_LIMIT = 500
ABANDONED_ERROR = "the scheduler holding this run stopped before it finished"
# Runs written before leases existed: abandoned once a later run finished and this long passed.
ABANDONED_RUN_GRACE_SECONDS = 300


class RunOutcome(StrEnum):
    """What became of one scheduled run."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    ABANDONED = "abandoned"


def claim_run(conn: Connection, *, job: str, period_start: datetime, instance: str,
              now: datetime, lease_seconds: float) -> int | None:
    """Insert the 'running' row of this period, leased; None when another instance has it."""
    stmt = (
        conflict_insert(conn, scheduler_runs)
        .values(job=job, period_start=period_start, instance=instance, started_at=now,
                outcome=RunOutcome.RUNNING.value,
                leased_until=now + timedelta(seconds=lease_seconds))
        .on_conflict_do_nothing(index_elements=["job", "period_start"])
        .returning(scheduler_runs.c.id)
    )
    return conn.execute(stmt).scalar()


def finish_run(conn: Connection, run_id: int, *, outcome: RunOutcome, now: datetime,
               rows_affected: int | None = None, error: str | None = None) -> None:
    """Record how a run ended (also over an 'abandoned' mark: the holder was alive)."""
    conn.execute(
        update(scheduler_runs).where(scheduler_runs.c.id == run_id).values(
            finished_at=now, outcome=outcome.value, rows_affected=rows_affected,
            error=error[:ERROR_TEXT_LIMIT] if error else None)
    )


def renew_lease(conn: Connection, run_id: int, *, now: datetime, lease_seconds: float) -> bool:
    """Extend a running run's lease; False if it is no longer running (marked abandoned)."""
    return conn.execute(
        update(scheduler_runs).where(scheduler_runs.c.id == run_id,
                                     scheduler_runs.c.outcome == RunOutcome.RUNNING.value)
        .values(leased_until=now + timedelta(seconds=lease_seconds))
    ).rowcount == 1


def mark_abandoned_runs(conn: Connection, *, now: datetime, grace_seconds: float,
                        job: str | None = None) -> int:
    """Mark 'running' rows abandoned whose lease ran out (of one job, or of all).

    A live holder renews its lease while the job runs, so an expired lease means
    the holder died (kill -9, a crash, a lost host). Rows written before leases
    existed have none: for them a later finished run of the job proves the
    schedulers moved on, and the grace keeps a long but live run from being
    relabelled early. If the holder was alive after all, its finish_run
    overwrites the mark.
    """
    later = scheduler_runs.alias("later")
    expired = scheduler_runs.c.leased_until < now
    unleased = and_(
        scheduler_runs.c.leased_until.is_(None),
        scheduler_runs.c.started_at < now - timedelta(seconds=grace_seconds),
        exists(select(later.c.id).where(and_(
            later.c.job == scheduler_runs.c.job,
            later.c.period_start > scheduler_runs.c.period_start,
            later.c.finished_at.is_not(None)))))
    stmt = (
        update(scheduler_runs)
        .where(scheduler_runs.c.outcome == RunOutcome.RUNNING.value, or_(expired, unleased))
        .values(outcome=RunOutcome.ABANDONED.value, finished_at=now, error=ABANDONED_ERROR)
    )
    if job is not None:
        stmt = stmt.where(scheduler_runs.c.job == job)
    return conn.execute(stmt).rowcount
