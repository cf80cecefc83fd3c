"""The settled band and the marks the incremental rollups share (jobs/rollups.py).

A rollup that is kept incrementally stores where its last run left a band of
time (`rollup_marks`, one row per rollup) and, next run, counts only the rows
that entered or left the band since, plus the band's unsettled edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    DateTime,
    Integer,
    Table,
    case,
    cast,
    delete,
    func,
    insert,
    literal_column,
    select,
    text,
)

from ledger.config import CLOCK_SKEW_SECONDS
from ledger.db.engine import conflict_insert
from ledger.db.locks import advisory_key
from ledger.db.schema import rollup_marks
from ledger.db.timestamps import as_utc

HOUR = timedelta(hours=1)
# Intake stamps accepted_at before it commits: receipts younger than this are
# recounted every run instead of settled, so a commit up to a minute late is
# still counted (a later one waits for a recount: scope_totals' recount of its
# scope, which comes round within a day and one run, the series' recount of its hour,
# which comes round every ~171 runs at one a minute).
SETTLE_LAG_SECONDS = 60
# The settled band starts this far after the retention cutoff; a purge (on any
# instance, clock skew included) cannot delete from it before the next run.
PURGE_MARGIN_SECONDS = 1800
# The delivery hours recount in full this often; scope_totals recounts each scope
# whole once in this time, a slice per run (jobs/rollups.py REPAIR_CYCLE_SECONDS).
FULL_RECOUNT_SECONDS = 86400


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """The settled band [start, end) of a rollup's time column."""

    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Mark:
    """Where the last run left the settled band, and when it last recounted in full."""

    band: Band
    counted_at: datetime
    recounted_at: datetime
    repaired_hour: int | None = None
    repaired_scope: int | None = None


def settled_band(now: datetime, retention_seconds: float,
                 lag_seconds: float = SETTLE_LAG_SECONDS) -> Band:
    """Return the band a run at `now` settles (empty when retention is that short)."""
    end = now - timedelta(seconds=lag_seconds)
    start = now + timedelta(seconds=PURGE_MARGIN_SECONDS - retention_seconds)
    return Band(start=min(start, end), end=end)


def lock_mark(conn: Connection, name: str) -> None:
    """Serialize runs of one rollup on PostgreSQL: a racing run would apply a delta twice."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(name)})


def read_mark(conn: Connection, name: str) -> Mark | None:
    """Return the stored mark of the rollup `name`, if any."""
    row = conn.execute(select(rollup_marks).where(rollup_marks.c.name == name)).first()
    if row is None:
        return None
    start, end = as_utc(row.settled_from), as_utc(row.settled_until)
    counted, recounted = as_utc(row.counted_at), as_utc(row.recounted_at)
    assert start and end and counted and recounted  # NOT NULL columns
    return Mark(band=Band(start=start, end=end), counted_at=counted, recounted_at=recounted,
                repaired_hour=row.repaired_hour, repaired_scope=row.repaired_scope)


def write_mark(conn: Connection, name: str, band: Band, now: datetime,
               recounted_at: datetime, *, repaired_hour: int | None = None,
               repaired_scope: int | None = None) -> None:
    """Store where this run left the band of the rollup `name` (and what it repaired)."""
    conn.execute(delete(rollup_marks).where(rollup_marks.c.name == name))
    conn.execute(insert(rollup_marks).values(name=name, settled_from=band.start,
                                             settled_until=band.end, counted_at=now,
                                             recounted_at=recounted_at,
                                             repaired_hour=repaired_hour,
                                             repaired_scope=repaired_scope))


def mark_to_step(conn: Connection, name: str, band: Band, now: datetime, *,
                 full: bool = False, recount_seconds: float | None = FULL_RECOUNT_SECONDS
                 ) -> Mark | None:
    """Lock the rollup `name` and return the mark this run steps from to `band`.

    None means count in full: asked to, no mark yet, `recount_seconds` since the last
    full count (None: a rollup that repairs itself run by run), or the stored band
    cannot be moved to `band` exactly (`can_step`).
    """
    lock_mark(conn, name)
    mark = read_mark(conn, name)
    if full or mark is None or not can_step(mark, band, now) or (
            recount_seconds is not None
            and now - mark.recounted_at >= timedelta(seconds=recount_seconds)):
        return None
    return mark


def can_step(mark: Mark, band: Band, now: datetime) -> bool:
    """Return whether the stored band can be moved forward to `band` exactly."""
    since_run = now - mark.counted_at
    return (timedelta(0) <= since_run
            <= timedelta(seconds=PURGE_MARGIN_SECONDS - CLOCK_SKEW_SECONDS)
            and mark.band.start <= band.start and mark.band.end <= band.end
            # A changed retention changes the band's width: recount.
            and mark.band.end - mark.band.start == band.end - band.start)


def upsert(conn: Connection, table: Table, keys: list[str], rows: list[dict[str, Any]]) -> None:
    """Write `rows` of `table`, replacing the other columns where a row's key exists.

    One statement for all of them: deleting each changed row before inserting it again
    cost as much as the insert (5,000 series cells a run at 10M receipts).
    """
    if not rows:
        return
    stmt = conflict_insert(conn, table)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=keys, set_={c: stmt.excluded[c] for c in rows[0] if c not in keys}),
        rows)


def flag(condition: Any) -> Any:
    """Return 1 where `condition` holds, else 0, for a SUM."""
    return case((condition, 1), else_=0)


def hour_bucket(conn: Connection, column: Any) -> Any:
    """Return an SQL expression for the hour of `column` to group by; `bucket_index`
    turns its value into the hour's index (whole hours since the epoch, UTC).

    PostgreSQL bins the timestamp (`date_bin`, exact integer arithmetic): the epoch's
    `extract` is a numeric, whose division cost 70 ms per 200,000 receipts grouped.
    """
    if conn.dialect.name == "postgresql":
        return func.date_bin(literal_column("INTERVAL '1 hour'"), column,
                             literal_column("TIMESTAMPTZ '1970-01-01 00:00:00+00'"),
                             type_=DateTime(timezone=True))
    return cast(func.strftime("%s", column), Integer) // 3600


def bucket_index(value: datetime | int) -> int:
    """Return the hour index of an `hour_bucket` value."""
    return value if isinstance(value, int) else index_of(value)


def hour_of(index: int) -> datetime:
    """Return the start of the hour `index` hours after the epoch."""
    return datetime.fromtimestamp(index * 3600, UTC)


def index_of(when: datetime) -> int:
    """Return the hour index of `when` (whole hours since the epoch)."""
    return int(when.timestamp()) // 3600


def hour_spans(since: datetime, until: datetime | None,
               now: datetime) -> list[tuple[datetime, datetime | None]]:
    """Split [since, until) at hour boundaries up to the hour of `now`; the rest is one span.

    A full recount reads one span per statement, so each stays inside the statement
    timeout (5 s by default) however many days the window holds. With `until` None
    the last span is open (receipts stamped ahead of this clock are counted too).
    """
    last = hour_of(index_of(now))
    spans: list[tuple[datetime, datetime | None]] = []
    start = since
    while start < last and (until is None or start < until):
        end = min(hour_of(index_of(start) + 1), until or last)
        spans.append((start, end))
        start = end
    if until is None or start < until:
        spans.append((start, until))
    return spans
