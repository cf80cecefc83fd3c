"""Per-integration delivery health over 24 hours and 7 days, from the hourly_series rollup."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, func, select

from ledger.db.schema import hourly_series

HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """Accepted and failed per bucket (hour or day), oldest first, with totals."""

    label: str
    buckets: list[tuple[datetime, int, int]]

    @property
    def accepted(self) -> int:
        """Return the deliveries accepted in the window."""
        return sum(a for _, a, _ in self.buckets)

    @property
    def failed(self) -> int:
        """Return the receipts that failed in the window."""
        return sum(f for _, _, f in self.buckets)

    @property
    def success_rate(self) -> float | None:
        """Return 1 - failed/accepted (None without deliveries)."""
        if not self.accepted:
            return None
        return max(0.0, 1.0 - self.failed / self.accepted)


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """An integration's last 24 hours (hourly) and 7 days (daily), and the rollup's age."""

    day: Window
    week: Window
    refreshed_at: datetime | None


def read_health(conn: Connection, scope_id: int, now: datetime) -> Health:
    """Return the integration's hourly and daily accepted/failed counts (zeros filled in)."""
    current = datetime.fromtimestamp(int(now.timestamp()) // 3600 * 3600, UTC)
    week_start = current - timedelta(days=7) + HOUR
    rows = conn.execute(
        select(hourly_series.c.hour, hourly_series.c.accepted, hourly_series.c.failed)
        .where(hourly_series.c.scope_id == scope_id, hourly_series.c.hour >= week_start)
    ).all()
    by_hour = {r.hour: (int(r.accepted), int(r.failed)) for r in rows}
    hours = [current - HOUR * i for i in range(23, -1, -1)]
    day = Window(label="last 24 hours, per hour",
                 buckets=[(h, *by_hour.get(h, (0, 0))) for h in hours])
    days: list[tuple[datetime, int, int]] = []
    for d in range(7):
        start = week_start + timedelta(days=d)
        span = [by_hour.get(start + HOUR * i, (0, 0)) for i in range(24)]
        days.append((start, sum(a for a, _ in span), sum(f for _, f in span)))
    refreshed = conn.execute(select(func.max(hourly_series.c.refreshed_at)).where(
        hourly_series.c.scope_id == scope_id)).scalar()
    return Health(day=day, week=Window(label="last 7 days, per day", buckets=days),
                  refreshed_at=refreshed)
