"""Retry policy: full-jitter backoff bounds and the terminal rules, with injected clock/RNG."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.clock import FixedClock
from ledger.config import Settings
from ledger.worker.retry import RetryPolicy

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(base_seconds=10, cap_seconds=3600, max_attempts=8,
                     max_event_age_seconds=259200)


class FixedRandom:
    """An RNG that always answers the same fraction."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        """Return the fixed fraction."""
        return self.value


@pytest.mark.parametrize(("failed", "ceiling"), [
    (1, 10), (2, 20), (3, 40), (4, 80), (9, 2560), (10, 3600), (50, 3600), (10_000, 3600),
])
def test_ceiling_doubles_from_base_until_the_cap(failed: int, ceiling: float) -> None:
    assert POLICY.ceiling(failed) == ceiling


def test_jitter_spans_zero_to_the_ceiling() -> None:
    assert POLICY.delay(3, FixedRandom(0.0)) == 0
    assert POLICY.delay(3, FixedRandom(0.5)) == 20
    assert POLICY.delay(3, FixedRandom(0.999999)) == pytest.approx(40, rel=1e-5)


@given(failed=st.integers(min_value=1, max_value=200), seed=st.integers())
def test_every_delay_is_within_bounds(failed: int, seed: int) -> None:
    delay = POLICY.delay(failed, random.Random(seed))
    assert 0 <= delay <= min(3600, 10 * 2 ** (failed - 1))


def test_delays_are_spread_not_constant() -> None:
    rng = random.Random(7)
    delays = {round(POLICY.delay(5, rng), 3) for _ in range(50)}
    assert len(delays) > 40
    assert max(delays) <= 160


def test_after_failure_schedules_from_the_injected_clock() -> None:
    clock = FixedClock(T0)
    clock.advance(100)
    decision = POLICY.after_failure(2, now=clock.now(), window_start=T0, rng=FixedRandom(0.25))
    assert not decision.terminal
    assert decision.run_at == clock.now() + timedelta(seconds=5)


def test_terminal_at_max_attempts() -> None:
    decision = POLICY.after_failure(8, now=T0, window_start=T0, rng=FixedRandom(0.0))
    assert decision.terminal
    assert "max attempts" in (decision.reason or "")
    assert not POLICY.after_failure(7, now=T0, window_start=T0, rng=FixedRandom(0.0)).terminal


def test_terminal_when_the_retry_would_start_past_the_max_age() -> None:
    policy = RetryPolicy(base_seconds=100, cap_seconds=100, max_attempts=8,
                         max_event_age_seconds=1000)
    late = T0 + timedelta(seconds=950)
    assert policy.after_failure(1, now=late, window_start=T0, rng=FixedRandom(0.9)).terminal
    decision = policy.after_failure(1, now=late, window_start=T0, rng=FixedRandom(0.1))
    assert decision.run_at == late + timedelta(seconds=10)


def test_refuse_to_start_counts_crashed_attempts_and_age() -> None:
    assert POLICY.refuse_to_start(8, now=T0, window_start=T0) is None
    assert "MaxAttemptsExceeded" in (POLICY.refuse_to_start(9, now=T0, window_start=T0) or "")
    old = T0 + timedelta(seconds=259201)
    assert "MaxEventAgeExceeded" in (POLICY.refuse_to_start(1, now=old, window_start=T0) or "")


def test_policy_reads_the_contract_settings() -> None:
    settings = Settings.from_env({"LEDGER_RETRY_BASE_SECONDS": "2",
                                  "LEDGER_RETRY_CAP_SECONDS": "30", "LEDGER_MAX_ATTEMPTS": "3",
                                  "LEDGER_MAX_EVENT_AGE_SECONDS": "60"})
    assert RetryPolicy.from_settings(settings) == RetryPolicy(
        base_seconds=2, cap_seconds=30, max_attempts=3, max_event_age_seconds=60)
    assert RetryPolicy.from_settings(Settings.from_env({})) == POLICY
