"""The hourly series' spread repair (jobs/rollup_series.repair_hour): runs a minute
apart recount every hour of the 7-day window in turn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from jobs.rollup_band import index_of
from jobs.rollup_series import SERIES_HOURS, repair_hour, window_start

STARTS = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 1, 1),
                      timezones=st.just(UTC))


@given(start=STARTS, jitter=st.integers(0, 59))
def test_runs_a_minute_apart_recount_every_hour_of_the_window_within_one_cycle(
        start: datetime, jitter: int) -> None:
    runs = [start + timedelta(minutes=i, seconds=jitter % 7) for i in range(SERIES_HOURS)]
    repaired = {repair_hour(now) for now in runs}
    # every hour that stays in the window through the cycle, the current one included
    kept = range(index_of(window_start(runs[-1])), index_of(runs[0]) + 1)
    assert set(kept) <= repaired


@given(now=STARTS)
def test_the_repaired_hour_is_always_inside_the_window(now: datetime) -> None:
    hour = repair_hour(now)
    assert index_of(window_start(now)) <= hour <= index_of(now)
