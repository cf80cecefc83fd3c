"""How an attempt ends, recorded and reported the same way for every work item.

Each function here writes inside the caller's transaction, after the caller made
sure the work item is still ours (`hold_work`), and
returns an `Outcome`; the worker logs and counts it once the transaction commits
(`Worker.report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from ledger.destinations.delivery import NotAdmitted, failure_group_of
from ledger.worker.retry import RandomSource, RetryPolicy
from ledger.worker.store import (
    WorkItem,
    fail_job,
    finish_attempt,
    hand_back_attempt,
    previous_outcome,
    schedule_retry,
    unstart_attempt,
)

# A job of a type another live worker handles comes back after 1-2 s (jittered): soon
# enough for that worker, which polls twice a second, late enough not to spin on it.
HANDOFF_SECONDS = 2.0
HANDED_OFF = "no handler here; a live worker has one"
# A job its paused destination holds back comes again after 150-300 s (jittered): `resume`
# makes the held jobs due at once; this only bounds the wait of a job that was being
# held back while the resume committed.
PAUSED_HOLD_SECONDS = 300.0
# Jobs a destination holds back (backoff, rate, in flight) come again at the moment it
# named plus up to this much jitter (at most the wait itself, at least MIN): a backlog
# that was held together does not return in one wave.
HOLD_JITTER_MAX_SECONDS = 10.0
HOLD_JITTER_MIN_SECONDS = 1.0

# The log line of each outcome: (state it moves the receipt's job to).
_TO_STATE = {"complete": "complete", "failed": "failed", "retry": "retrying",
             "interrupted": "retrying", "handed-off": "retrying", "held": "queued",
             "fenced": "fenced"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How one attempt ended: complete, retry, interrupted, failed, handed-off or fenced."""

    outcome: str
    error: str | None = None  # the attempt's error as stored (never the payload)
    reason: str | None = None  # why it is terminal, or why it was handed off
    retry_in: float | None = None  # seconds until it is due again

    @property
    def to_state(self) -> str:
        """Return the state the transition log line names."""
        return _TO_STATE[self.outcome]

    @property
    def terminal(self) -> bool:
        """Tell whether the receipt ended `failed`."""
        return self.outcome == "failed"


COMPLETE = Outcome(outcome="complete")
FENCED = Outcome(outcome="fenced")


def record_failed_attempt(conn: Connection, job: WorkItem, error: BaseException | None,
                          summary: str, *, policy: RetryPolicy, rng: RandomSource,
                          now: datetime) -> Outcome:
    """Close a held job's failed attempt and schedule its retry, or end the receipt.

    `error` None: a database error cut the attempt off. That spends no attempt:
    it is handed back to the budget and only the event's age can end it. A
    handler's own failure follows the retry policy and the handler's wish
    (PermanentFailure, RetryAfter: RetryPolicy.after_error). A destination that did
    not admit the request (NotAdmitted) holds the job back: no attempt spent.
    """
    if isinstance(error, NotAdmitted):
        return hold_back(conn, job, error, rng=rng, now=now)
    interrupted = error is None
    if error is None:
        decision = policy.after_interruption(job.number, now=now,
                                             window_start=job.window_start, rng=rng)
    else:
        decision = policy.after_error(error, job.attempt, now=now,
                                      window_start=job.window_start, rng=rng)
    if decision.run_at is None:
        finish_attempt(conn, job, outcome="failed", now=now, error=summary)
        fail_job(conn, job, now=now, error=summary, group_type=failure_group_of(error))
        return Outcome(outcome="failed", error=summary, reason=decision.reason)
    outcome = "interrupted" if interrupted else "retry"
    finish_attempt(conn, job, outcome=outcome, now=now, error=summary)
    if interrupted:
        hand_back_attempt(conn, job, run_at=decision.run_at)
    else:
        schedule_retry(conn, job, run_at=decision.run_at)
    return Outcome(outcome=outcome, error=summary,
                   retry_in=round((decision.run_at - now).total_seconds(), 3))


def hand_off(conn: Connection, job: WorkItem, *, rng: RandomSource,
             now: datetime) -> Outcome:
    """Hand a held work item back without spending an attempt, due again shortly (a rolling
    deploy).

    The receipt's history shows one `handed-off` attempt, however often it comes
    back before the live worker takes it: a later hand-back is undone as if
    never claimed (no attempt row, not counted).
    """
    run_at = now + timedelta(seconds=HANDOFF_SECONDS * (0.5 + rng.random() / 2))
    if previous_outcome(conn, job) == "handed-off":
        unstart_attempt(conn, job, run_at=run_at)
    else:
        finish_attempt(conn, job, outcome="handed-off", now=now)
        hand_back_attempt(conn, job, run_at=run_at)
    return Outcome(outcome="handed-off", reason=HANDED_OFF,
                   retry_in=round((run_at - now).total_seconds(), 3))


def hold_back(conn: Connection, job: WorkItem, held: NotAdmitted, *, rng: RandomSource,
              now: datetime) -> Outcome:
    """Put back a job its destination did not admit, as if never claimed: no attempt spent."""
    if held.not_before is None:  # paused
        run_at = now + timedelta(seconds=PAUSED_HOLD_SECONDS * (0.5 + rng.random() / 2))
    else:
        start = max(held.not_before, now)
        window = (start - now).total_seconds()
        window = min(max(window, HOLD_JITTER_MIN_SECONDS), HOLD_JITTER_MAX_SECONDS)
        run_at = start + timedelta(seconds=window * rng.random())
    unstart_attempt(conn, job, run_at=run_at)
    return Outcome(outcome="held", reason=f"destination {held.reason}",
                   retry_in=round((run_at - now).total_seconds(), 3))
