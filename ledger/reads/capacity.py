"""Capacity: the seed's equation fed with bytes measured from this database.

    projected_bytes = events_per_day * retention_days * bytes_per_receipt

bytes_per_receipt is the receipts table's real footprint divided by its rows:
PostgreSQL `pg_total_relation_size` (heap + every index + TOAST, free space and
dead tuples included, because the disk holds them too), or on a distributed
(Citus) ledger `citus_total_relation_size`, the same summed over every shard on
every node (the coordinator's own table is an empty shell); SQLite the `dbstat`
virtual table's pages of the table and its indexes. events_per_day is what the
ledger accepted over the last 24 hours. Work items (the `jobs` table) are not counted: a
finished one's row is deleted, so they scale with the backlog, not with retention.

The dashboard and the API read the two counts from the rollups (`from_rollups`:
scope_counts and the hourly totals, up to a rollups period old, the day in whole
hours) instead of counting the table per view: at 10M receipts the two counts
took most of a second. `ledger capacity` counts exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, func, select, text

from ledger.config import Settings
from ledger.db import citus
from ledger.db.schema import hourly_totals, receipts, scope_counts
from ledger.reads.models import CapacityFigures

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def measure(engine: Engine, settings: Settings, *, replicas: int = 1,
            now: datetime | None = None, from_rollups: bool = False) -> CapacityFigures:
    """Return the CONTRACT's `ledger capacity` figures (plus `replicas` when not 1)."""
    with engine.connect() as conn:
        return measure_on(conn, settings, replicas=replicas, now=now, from_rollups=from_rollups)


def measure_on(conn: Connection, settings: Settings, *, replicas: int = 1,
               now: datetime | None = None, from_rollups: bool = False) -> CapacityFigures:
    """Return the capacity figures read on `conn` (a replica's, for the dashboard)."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    since = (now or datetime.now(UTC)) - DAY
    counted = _from_rollups(conn, since) if from_rollups else None
    rows, per_day = counted or _exact_counts(conn, since)
    size = receipts_bytes(conn)
    per_receipt = round(size / rows, 1) if rows else None
    retention_days = round(settings.retention_seconds / 86400, 4)
    projected = (round(per_day * retention_days * per_receipt * replicas)
                 if per_receipt is not None else None)
    result: CapacityFigures = {
        "receipts": rows, "bytes_per_receipt_measured": per_receipt,
        "retention_days": retention_days, "events_per_day": per_day,
        "projected_bytes": projected,
    }
    if replicas != 1:
        result["replicas"] = replicas
    return result


def _exact_counts(conn: Connection, since: datetime) -> tuple[int, int]:
    """Return (receipts, receipts accepted since `since`) counted from the table."""
    rows = int(conn.execute(select(func.count()).select_from(receipts)).scalar_one())
    per_day = int(conn.execute(select(func.count()).select_from(receipts)
                               .where(receipts.c.accepted_at >= since)).scalar_one())
    return rows, per_day


def _from_rollups(conn: Connection, since: datetime) -> tuple[int, int] | None:
    """Return (receipts, accepted in the hours since `since`) from the rollups, if run."""
    rows = conn.execute(select(func.sum(scope_counts.c.count))).scalar()
    if rows is None:
        return None
    per_day = conn.execute(select(func.coalesce(func.sum(hourly_totals.c.accepted), 0))
                           .where(hourly_totals.c.hour > since - HOUR)).scalar_one()
    return int(rows), int(per_day)


def receipts_bytes(conn: Connection) -> int:
    """Return the bytes the receipts table occupies with its indexes (and TOAST)."""
    if conn.dialect.name == "postgresql":
        if citus.layout(conn).tables["receipts"] == "distributed":
            return int(conn.execute(text(
                "SELECT citus_total_relation_size('receipts')")).scalar_one())
        return int(conn.execute(text("SELECT pg_total_relation_size('receipts')")).scalar_one())
    names = [row[0] for row in conn.execute(text(
        "SELECT name FROM sqlite_master WHERE tbl_name = 'receipts' "
        "AND type IN ('table', 'index')"))]
    marks = ", ".join(f":n{i}" for i in range(len(names)))
    return int(conn.execute(
        text(f"SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN ({marks})"),
        {f"n{i}": name for i, name in enumerate(names)}).scalar_one())


def describe(figures: CapacityFigures) -> str:
    """Return the figures as a few readable lines for a terminal."""
    per, projected = figures["bytes_per_receipt_measured"], figures["projected_bytes"]
    if per is None or projected is None:
        return "no receipts yet: nothing to measure (deliver some events first)"
    lines = [
        f"receipts:            {figures['receipts']:,}",
        f"bytes per receipt:   {per:,} (measured: table + indexes + TOAST)",
        f"events per day:      {figures['events_per_day']:,} (accepted in the last 24 h)",
        f"retention days:      {figures['retention_days']}",
    ]
    if "replicas" in figures:
        lines.append(f"replicas:            {figures['replicas']}")
    lines.append(f"projected bytes:     {projected:,} (≈ {projected / 1e9:.2f} GB)")
    return "\n".join(lines)
