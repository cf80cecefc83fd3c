"""Retry policy: exponential backoff with full jitter, bounded by attempts and event age.

After the n-th failed attempt (n >= 1) the next one waits a uniformly random
delay in [0, min(cap, base * 2^(n-1))] ("full jitter": retries of many events
that failed together spread out instead of returning in a wave). The event
becomes terminal (`failed`) when n reaches LEDGER_MAX_ATTEMPTS, or when the
retry would start after LEDGER_MAX_EVENT_AGE_SECONDS from the start of the
event's retry window (acceptance, or an operator's requeue).

A handler may decide instead (ledger.handlers): `PermanentFailure` ends the
event at once; `RetryAfter(s)` sets the next attempt s seconds later, still
within the same bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from ledger.config import Settings
from ledger.errors import ERROR_SUMMARY_LIMIT, error_summary
from ledger.handlers import PermanentFailure, RetryAfter

PERMANENT_REASON = "the handler raised PermanentFailure"

# 2**64 * base is past any cap anyone configures; stop doubling there.
_MAX_DOUBLINGS = 64


class RandomSource(Protocol):
    """Anything with `random() -> float in [0, 1)`: random.Random, or a test's fake."""

    def random(self) -> float:
        """Return a float in [0, 1)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryDecision:
    """When to try again, or why not to."""

    run_at: datetime | None
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        """Tell whether the event has run out of attempts or time."""
        return self.run_at is None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """The contract's retry settings."""

    base_seconds: float = 10
    cap_seconds: float = 3600
    max_attempts: int = 8
    max_event_age_seconds: float = 259200

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """Return the policy configured by LEDGER_RETRY_* and LEDGER_MAX_*."""
        return cls(base_seconds=settings.retry_base_seconds,
                   cap_seconds=settings.retry_cap_seconds,
                   max_attempts=settings.max_attempts,
                   max_event_age_seconds=settings.max_event_age_seconds)

    def ceiling(self, failed_attempts: int) -> float:
        """Return the largest delay after `failed_attempts` failures: min(cap, base*2^(n-1))."""
        doublings = min(max(failed_attempts - 1, 0), _MAX_DOUBLINGS)
        return float(min(self.cap_seconds, self.base_seconds * 2**doublings))

    def delay(self, failed_attempts: int, rng: RandomSource) -> float:
        """Return a full-jitter delay in [0, ceiling]."""
        return self.ceiling(failed_attempts) * rng.random()

    def deadline(self, window_start: datetime) -> datetime:
        """Return the moment after which the event is too old to run."""
        return window_start + timedelta(seconds=self.max_event_age_seconds)

    def refuse_to_start(self, attempt: int, *, now: datetime, window_start: datetime
                        ) -> str | None:
        """Return why attempt number `attempt` must not start, or None if it may."""
        if attempt > self.max_attempts:
            return (f"MaxAttemptsExceeded: {attempt - 1} attempts started "
                    f"(limit {self.max_attempts}); the last ones ended without an outcome")
        if now > self.deadline(window_start):
            age = int((now - window_start).total_seconds())
            return (f"MaxEventAgeExceeded: event is {age}s old "
                    f"(limit {int(self.max_event_age_seconds)}s)")
        return None

    def after_interruption(self, attempts_so_far: int, *, now: datetime,
                           window_start: datetime, rng: RandomSource) -> RetryDecision:
        """Decide when an attempt the database cut off runs again; it spends no attempt.

        The wait is a full-jitter delay after `attempts_so_far` attempts (the
        receipt's history, so repeated interruptions back off); only the event's
        age makes it terminal.
        """
        run_at = now + timedelta(seconds=self.delay(attempts_so_far, rng))
        if run_at > self.deadline(window_start):
            return RetryDecision(
                run_at=None,
                reason=f"max event age reached ({int(self.max_event_age_seconds)}s)")
        return RetryDecision(run_at=run_at)

    def after_failure(self, failed_attempts: int, *, now: datetime, window_start: datetime,
                      rng: RandomSource) -> RetryDecision:
        """Decide what follows the `failed_attempts`-th failure: a retry time, or terminal."""
        if failed_attempts >= self.max_attempts:
            return RetryDecision(run_at=None,
                                 reason=f"max attempts reached ({self.max_attempts})")
        run_at = now + timedelta(seconds=self.delay(failed_attempts, rng))
        if run_at > self.deadline(window_start):
            return RetryDecision(
                run_at=None,
                reason=f"max event age reached ({int(self.max_event_age_seconds)}s)")
        return RetryDecision(run_at=run_at)

    def after_error(self, error: BaseException, failed_attempts: int, *, now: datetime,
                    window_start: datetime, rng: RandomSource) -> RetryDecision:
        """Decide what follows a failed attempt, as the handler's exception asks."""
        if isinstance(error, PermanentFailure):
            return RetryDecision(run_at=None, reason=PERMANENT_REASON)
        decision = self.after_failure(failed_attempts, now=now, window_start=window_start,
                                      rng=rng)
        if decision.run_at is None or not isinstance(error, RetryAfter):
            return decision
        # Exactly the delay asked for (never sooner); past the event's age it ends.
        run_at = now + timedelta(seconds=min(error.seconds, self.max_event_age_seconds + 1))
        if run_at > self.deadline(window_start):
            return RetryDecision(
                run_at=None,
                reason=f"max event age reached ({int(self.max_event_age_seconds)}s)")
        return RetryDecision(run_at=run_at)


def failure_summary(error: BaseException) -> str:
    """Return the attempt's error as stored: a PermanentFailure's own reason, else
    "Class: message"."""
    if isinstance(error, PermanentFailure):
        lines = str(error.reason).strip().splitlines()
        return (lines[0] if lines else "PermanentFailure")[:ERROR_SUMMARY_LIMIT]
    return error_summary(error)
