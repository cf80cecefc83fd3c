"""What a handler's PermanentFailure and RetryAfter make of the retry policy (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ledger.handlers import PermanentFailure, RetryAfter, handler
from ledger.worker.retry import PERMANENT_REASON, RetryPolicy, failure_summary

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(base_seconds=10, cap_seconds=3600, max_attempts=3,
                     max_event_age_seconds=86400)


class Half:
    """An RNG that always answers one half."""

    def random(self) -> float:
        """Return 0.5."""
        return 0.5


def _after(error: BaseException, failed: int = 1, window_start: datetime = NOW):
    return POLICY.after_error(error, failed, now=NOW, window_start=window_start, rng=Half())


def test_permanent_failure_ends_at_once_with_its_reason_as_the_error():
    decision = _after(PermanentFailure("invoice 7 does not exist\nsecond line"))
    assert (decision.run_at, decision.reason) == (None, PERMANENT_REASON)
    assert failure_summary(PermanentFailure("invoice 7 does not exist\nsecond line")) == (
        "invoice 7 does not exist")


def test_retry_after_sets_the_delay_within_the_attempts_and_the_age():
    assert _after(RetryAfter(7200)).run_at == NOW + timedelta(seconds=7200)  # past the cap
    assert _after(RetryAfter(0.5)).run_at == NOW + timedelta(seconds=0.5)
    assert _after(RetryAfter(60), failed=3).run_at is None  # LEDGER_MAX_ATTEMPTS
    too_late = _after(RetryAfter(3600), window_start=NOW - timedelta(seconds=86000))
    assert too_late.run_at is None and "age" in (too_late.reason or "")
    assert failure_summary(RetryAfter(60, "rate limited")) == "RetryAfter: rate limited"


def test_any_other_error_keeps_the_jittered_backoff():
    assert _after(ValueError("no")).run_at == NOW + timedelta(seconds=5)


def test_handler_refuses_an_empty_event_type():
    with pytest.raises(ValueError):
        handler("")
