"""Work done lately: completions per minute and the queue's age (the Overview's chart).

Completions are read from the newest attempts by id (the primary key, newest first),
at most SAMPLE_ROWS of them: a bounded read whatever the table's size or the rate.
When those rows do not reach back over the whole window, the minutes before the
oldest one read are unknown, and said so (`covered_from`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, select

from ledger.db.schema import attempts, jobs
from ledger.domain import JobStatus

WINDOW_MINUTES = 15
SAMPLE_ROWS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """Completions per minute, oldest minute first, and how old the oldest due work item is."""

    per_minute: list[tuple[datetime, int | None]]  # None: a minute the sample did not reach
    per_minute_now: float  # the average over the minutes known, completions per minute
    covered_from: datetime  # the window's start, or the oldest attempt read
    queue_age_seconds: float | None  # the oldest due work item's wait; None when nothing is due


def newest_attempts_stmt() -> Select[Any]:
    """The newest SAMPLE_ROWS attempts, by id (the primary key, read backwards)."""
    return (select(attempts.c.started_at, attempts.c.finished_at, attempts.c.outcome)
            .order_by(attempts.c.id.desc()).limit(SAMPLE_ROWS))


def read_throughput(conn: Connection, now: datetime) -> Throughput:
    """Return completions per minute over the last WINDOW_MINUTES and the queue's age."""
    start = (now - timedelta(minutes=WINDOW_MINUTES)).replace(second=0, microsecond=0)
    rows = conn.execute(newest_attempts_stmt()).all()
    covered = start
    if len(rows) == SAMPLE_ROWS and rows[-1].started_at > start:
        covered = rows[-1].started_at
    minutes = [start + timedelta(minutes=i) for i in range(WINDOW_MINUTES + 1)]
    counts = dict.fromkeys(minutes, 0)
    for r in rows:
        if r.outcome == "complete" and r.finished_at is not None and r.finished_at >= start:
            minute = r.finished_at.replace(second=0, microsecond=0)
            if minute in counts:
                counts[minute] += 1
    known = [(m, n) for m, n in counts.items() if m >= covered.replace(second=0, microsecond=0)]
    span = max((now - max(start, covered)).total_seconds() / 60, 1 / 60)
    oldest_due = conn.execute(
        select(jobs.c.run_at).where(jobs.c.status == JobStatus.QUEUED.value,
                                    jobs.c.run_at <= now)
        .order_by(jobs.c.run_at).limit(1)).scalar()
    return Throughput(
        per_minute=[(m, counts[m] if (m, counts[m]) in known else None) for m in minutes],
        per_minute_now=sum(n for _, n in known) / span, covered_from=covered,
        queue_age_seconds=(now - oldest_due).total_seconds() if oldest_due else None)
