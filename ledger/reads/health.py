"""Per-integration delivery health over 24 hours and 7 days, from the hourly rollups.

Accepted and failed come from `hourly_series` (receipts), refusals and the
intake's latency from `hourly_refusals` and `hourly_latency` (the delivery log;
jobs/rollup_deliveries.py). A p95 is read from a fixed-bucket histogram: it is
the upper bound of the bucket holding the 95th percentile (LATENCY_BOUNDS_US:
each bound 1.33x or 1.5x the one before), over an hour or over a day's summed
buckets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, select

from ledger.db.schema import (
    DELIVERY_HOURS_MARK,
    LATENCY_BOUNDS_US,
    SERIES_MARK,
    hourly_latency,
    hourly_refusals,
    hourly_series,
    rollup_marks,
)

HOUR = timedelta(hours=1)
PERCENTILE = 0.95
Histogram = dict[int, int]  # latency bucket -> answered deliveries


def p95_ms(histogram: Mapping[int, int]) -> float | None:
    """Return the upper bound (ms) of the bucket holding the 95th percentile; inf past the last.

    None without answered deliveries.
    """
    total = sum(histogram.values())
    if not total:
        return None
    need, seen = math.ceil(PERCENTILE * total), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= need:
            break
    return LATENCY_BOUNDS_US[bucket] / 1000 if bucket < len(LATENCY_BOUNDS_US) else math.inf


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """One bucket of a chart (an hour or a day): what the intake saw then."""

    start: datetime
    accepted: int = 0
    failed: int = 0
    refused: int = 0
    latency: Histogram = field(default_factory=dict)

    @property
    def answered(self) -> int:
        """Return the deliveries answered 2xx or 409 that carry a latency."""
        return sum(self.latency.values())

    @property
    def p95_ms(self) -> float | None:
        """Return this slot's p95 intake latency (bucket upper bound), None without answers."""
        return p95_ms(self.latency)


def _merge(start: datetime, slots: list[Slot]) -> Slot:
    """Return one slot summing `slots` (a day of hours), histograms added bucket by bucket."""
    latency: Histogram = {}
    for slot in slots:
        for bucket, n in slot.latency.items():
            latency[bucket] = latency.get(bucket, 0) + n
    return Slot(start=start, accepted=sum(s.accepted for s in slots),
                failed=sum(s.failed for s in slots), refused=sum(s.refused for s in slots),
                latency=latency)


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """The slots of one chart (oldest first) and the window's totals."""

    label: str
    slots: list[Slot]

    @property
    def total(self) -> Slot:
        """Return the whole window as one slot (its p95 from the summed histograms)."""
        return _merge(self.slots[0].start, self.slots)

    @property
    def accepted(self) -> int:
        """Return the deliveries accepted in the window."""
        return self.total.accepted

    @property
    def failed(self) -> int:
        """Return the receipts that failed in the window."""
        return self.total.failed

    @property
    def success_rate(self) -> float | None:
        """Return 1 - failed/accepted (None without deliveries)."""
        if not self.accepted:
            return None
        return max(0.0, 1.0 - self.failed / self.accepted)


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """An integration's last 24 hours (hourly) and 7 days (daily), and the rollups' age."""

    day: Window
    week: Window
    refreshed_at: datetime | None
    deliveries_refreshed_at: datetime | None


def _hours(conn: Connection, scope_id: int, since: datetime) -> dict[datetime, Slot]:
    """Return every stored hour of the integration from `since`, all rollups joined."""
    counts: dict[datetime, dict[str, int]] = {}
    latency: dict[datetime, Histogram] = {}
    for r in conn.execute(select(hourly_series.c.hour, hourly_series.c.accepted,
                                 hourly_series.c.failed)
                          .where(hourly_series.c.scope_id == scope_id,
                                 hourly_series.c.hour >= since)):
        counts.setdefault(r.hour, {}).update(accepted=int(r.accepted), failed=int(r.failed))
    for hour, refused in conn.execute(
            select(hourly_refusals.c.hour, hourly_refusals.c.refused)
            .where(hourly_refusals.c.scope_id == scope_id, hourly_refusals.c.hour >= since)):
        counts.setdefault(hour, {})["refused"] = int(refused)
    for hour, bucket, n in conn.execute(
            select(hourly_latency.c.hour, hourly_latency.c.bucket, hourly_latency.c.deliveries)
            .where(hourly_latency.c.scope_id == scope_id, hourly_latency.c.hour >= since)):
        latency.setdefault(hour, {})[int(bucket)] = int(n)
    return {hour: Slot(start=hour, latency=latency.get(hour, {}), **counts.get(hour, {}))
            for hour in counts.keys() | latency.keys()}


def _counted_at(conn: Connection, name: str) -> datetime | None:
    """Return when the rollup `name` last ran."""
    return conn.execute(select(rollup_marks.c.counted_at)
                        .where(rollup_marks.c.name == name)).scalar()


def read_health(conn: Connection, scope_id: int, now: datetime) -> Health:
    """Return the integration's hourly (24 h) and daily (7 days) slots, zeros filled in."""
    current = datetime.fromtimestamp(int(now.timestamp()) // 3600 * 3600, UTC)
    week_start = current - timedelta(days=7) + HOUR
    by_hour = _hours(conn, scope_id, week_start)
    hours = [current - HOUR * i for i in range(23, -1, -1)]
    day = Window(label="last 24 hours, per hour",
                 slots=[by_hour.get(h, Slot(start=h)) for h in hours])
    days = []
    for d in range(7):
        start = week_start + timedelta(days=d)
        span = [by_hour.get(start + HOUR * i, Slot(start=start)) for i in range(24)]
        days.append(_merge(start, span))
    return Health(day=day, week=Window(label="last 7 days, per day", slots=days),
                  refreshed_at=_counted_at(conn, SERIES_MARK),
                  deliveries_refreshed_at=_counted_at(conn, DELIVERY_HOURS_MARK))
