"""The scheduler_runs table: one row per (job, period), written by whoever won the period.

The unique constraint on (job, period_start) is what makes a job run once per
period across every scheduler instance: the instance whose INSERT lands runs
the job, the others see the conflict and skip. Functions take `conn` and never
commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, and_, exists, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from ledger.schema import scheduler_runs

ERROR_TEXT_LIMIT = 500


class RunOutcome(StrEnum):
    """What became of one scheduled run."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    ABANDONED = "abandoned"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One row of scheduler_runs, for the dashboard and the CLI."""

    id: int
    job: str
    period_start: datetime
    instance: str
    started_at: datetime
    finished_at: datetime | None
    outcome: RunOutcome
    rows_affected: int | None
    error: str | None

    @classmethod
    def from_row(cls, row: Any) -> Run:
        """Build from a scheduler_runs row."""
        return cls(id=row.id, job=row.job, period_start=row.period_start,
                   instance=row.instance, started_at=row.started_at,
                   finished_at=row.finished_at, outcome=RunOutcome(row.outcome),
                   rows_affected=row.rows_affected, error=row.error)


def claim_run(conn: Connection, *, job: str, period_start: datetime, instance: str,
              now: datetime) -> int | None:
    """Insert the 'running' row of this period; None when another instance has it."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = (
        dialect.insert(scheduler_runs)
        .values(job=job, period_start=period_start, instance=instance, started_at=now,
                outcome=RunOutcome.RUNNING.value)
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


def mark_abandoned_runs(conn: Connection, *, now: datetime, grace_seconds: float) -> int:
    """Mark 'running' rows abandoned when a later period of the job has since finished.

    A later finished run proves the schedulers moved on; the grace keeps a long
    but live run from being relabelled early. If the holder was alive after all,
    its finish_run overwrites the mark.
    """
    later = scheduler_runs.alias("later")
    stmt = (
        update(scheduler_runs)
        .where(
            scheduler_runs.c.outcome == RunOutcome.RUNNING.value,
            scheduler_runs.c.started_at < now - timedelta(seconds=grace_seconds),
            exists(select(later.c.id).where(and_(
                later.c.job == scheduler_runs.c.job,
                later.c.period_start > scheduler_runs.c.period_start,
                later.c.finished_at.is_not(None)))),
        )
        .values(outcome=RunOutcome.ABANDONED.value, finished_at=now,
                error="the scheduler holding this run stopped before it finished")
    )
    return conn.execute(stmt).rowcount


def recent_runs(conn: Connection, *, limit: int = 50, job: str | None = None) -> list[Run]:
    """Return the newest runs, newest first (optionally of one job)."""
    query = select(scheduler_runs).order_by(scheduler_runs.c.period_start.desc(),
                                            scheduler_runs.c.id.desc()).limit(limit)
    if job is not None:
        query = query.where(scheduler_runs.c.job == job)
    return [Run.from_row(row) for row in conn.execute(query)]


def last_runs_by_job(conn: Connection) -> dict[str, Run]:
    """Return the newest run of every job (the dashboard's 'scheduled jobs' panel)."""
    newest = (select(scheduler_runs.c.job,
                     func.max(scheduler_runs.c.period_start).label("period_start"))
              .group_by(scheduler_runs.c.job).subquery())
    rows = conn.execute(
        select(scheduler_runs).join(newest, and_(
            newest.c.job == scheduler_runs.c.job,
            newest.c.period_start == scheduler_runs.c.period_start))
    )
    return {row.job: Run.from_row(row) for row in rows}

