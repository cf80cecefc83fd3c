"""Work done lately: completions per minute and the queue's age (the Overview's chart).

Completions are counted in the newest attempts by id (the primary key, newest first),
at most SAMPLE_ROWS of them: a bounded read whatever the table's size or the rate.
The database counts them per minute and answers one row, so the page does not turn
20,000 rows into Python objects on every view. When the sample does not reach back
over the whole window, the minutes before its oldest attempt are unknown, and said
so (`covered_from`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, case, func, select

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
    return (select(attempts.c.id, attempts.c.finished_at, attempts.c.outcome)
            .order_by(attempts.c.id.desc()).limit(SAMPLE_ROWS))


def per_minute_stmt(minutes: list[datetime]) -> Select[Any]:
    """The sample's size, its oldest attempt's id and its completions in each minute."""
    sample = newest_attempts_stmt().subquery()
    ends = [*minutes[1:], minutes[-1] + timedelta(minutes=1)]
    columns: list[Any] = [func.count().label("n"), func.min(sample.c.id).label("oldest_id")]
    columns += [func.count(case((and_(sample.c.outcome == "complete",
                                      sample.c.finished_at >= lo, sample.c.finished_at < hi),
                                 1))).label(f"m{i}")
                for i, (lo, hi) in enumerate(zip(minutes, ends, strict=True))]
    return select(*columns)


def read_throughput(conn: Connection, now: datetime) -> Throughput:
    """Return completions per minute over the last WINDOW_MINUTES and the queue's age."""
    start = (now - timedelta(minutes=WINDOW_MINUTES)).replace(second=0, microsecond=0)
    minutes = [start + timedelta(minutes=i) for i in range(WINDOW_MINUTES + 1)]
    row = conn.execute(per_minute_stmt(minutes)).one()
    covered = start
    if row.n == SAMPLE_ROWS:
        oldest = conn.execute(select(attempts.c.started_at)
                              .where(attempts.c.id == row.oldest_id)).scalar_one()
        covered = max(start, oldest)
    counts = {m: int(row[2 + i]) for i, m in enumerate(minutes)}
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
