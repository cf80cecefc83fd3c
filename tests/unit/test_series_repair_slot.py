"""The hourly series' spread repair (jobs/rollup_series.repair_hour): each run recounts
the hour after the previous run's, so at any rollups period the scheduler allows (up to
the purge margin; a longer pause counts the window in full) every hour of the 7-day
window is recounted while it is in the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.rollup_band import PURGE_MARGIN_SECONDS, index_of
from jobs.rollup_series import SERIES_HOURS, repair_hour, window_start

STARTS = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 1, 1),
                      timezones=st.just(UTC))


@settings(max_examples=30, deadline=None)
@given(start=STARTS, period=st.sampled_from([1, 60, 120, 180, 300, 600, 900, 1_500]))
def test_every_hour_is_recounted_while_it_is_in_the_window(start: datetime,
                                                           period: int) -> None:
    assert period <= PURGE_MARGIN_SECONDS
    days = 3 if period < 60 else 16
    runs = [start + timedelta(seconds=i * period) for i in range(days * 86_400 // period)]
    repaired: set[int] = set()
    last = None
    for now in runs:
        last = repair_hour(last, now)
        assert index_of(window_start(now)) <= last <= index_of(now)
        repaired.add(last)
    # every hour that entered the window after the first run and left it before the last
    lived = range(index_of(runs[0]) + 1, index_of(window_start(runs[-1])))
    assert set(lived) <= repaired


def test_a_run_after_a_full_count_or_past_the_current_hour_starts_at_the_window() -> None:
    now = datetime(2026, 12, 1, 18, 30, tzinfo=UTC)
    first = index_of(window_start(now))
    assert first == index_of(now) - SERIES_HOURS + 1
    assert repair_hour(None, now) == first
    assert repair_hour(first + 4, now) == first + 5
    assert repair_hour(index_of(now), now) == first  # wraps
    assert repair_hour(first - 3, now) == first  # the window moved past it
