"""Time as an injectable dependency: production uses the wall clock, tests a fixed one."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Something that tells the current UTC time."""

    def now(self) -> datetime:
        """Return the current time, timezone-aware UTC."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        """Return the current time, timezone-aware UTC."""
        return datetime.now(UTC)


class FixedClock:
    """A clock that only moves when told to (tests, the drill's sandbox)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)
        if self._now.tzinfo is None:
            raise ValueError("FixedClock needs a timezone-aware datetime")

    def now(self) -> datetime:
        """Return the frozen time."""
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward and return the new time."""
        self._now += timedelta(seconds=seconds)
        return self._now


def unix(moment: datetime) -> int:
    """Return whole seconds since the epoch for an aware datetime."""
    return int(moment.timestamp())


def monotonic() -> float:
    """Return a monotonic reading for measuring durations."""
    return time.monotonic()
