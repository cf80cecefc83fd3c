"""What every worker shares about a destination: its backoff, its rate, its requests in flight.

A failing destination must not burn each queued event's attempts (CONTRACT section 8): one
failure holds the whole destination (`blocked_until`), and its events wait behind it
without spending attempts. When it answers again, sends resume at `rate_per_second`
(`next_send_at` moves one interval per send) and at most `max_in_flight` at once.

Requests in flight are the destination's `sending` attempts: `admit` opens one for the work
item it admits, in the same transaction as its check, and the answer closes it. A worker that
dies mid-request leaves its row open, which stops counting once the request's own timeout
has passed, so nothing leaks. `admit` decides for one claimed work item in its own short
transaction, before the HTTP call and without holding any lock across it (STYLE rule 7);
`note_outcome` moves the backoff after the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func, or_, select, update

from ledger.db.schema import destination_attempts, destinations
from ledger.destinations.store import SENDING, DestinationState, open_attempt

# How long a work item waits when the destination has no free request slot: short, as a slot
# frees when any request ends.
IN_FLIGHT_WAIT_SECONDS = 1.0
# An open request counts until its timeout has passed, plus this margin for recording
# its answer.
IN_FLIGHT_SLACK_SECONDS = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """Whether a work item may be sent now; if not, why and the earliest moment to ask again."""

    admitted: bool
    reason: str | None = None  # "paused", "backoff", "in_flight", "rate"
    not_before: datetime | None = None  # None while paused: resume decides
    attempt_id: int | None = None  # the admitted request's open `sending` attempt


# Built once: every forwarded event is admitted with these.
_ROW = select(destinations).where(destinations.c.id == bindparam("destination"))
_ROW_LOCKED = _ROW.with_for_update()
_IN_FLIGHT = select(func.count()).select_from(
    select(destination_attempts.c.id)
    .where(destination_attempts.c.destination_id == bindparam("destination"),
           destination_attempts.c.started_at > bindparam("since"),
           destination_attempts.c.outcome == SENDING)
    .limit(bindparam("cap")).subquery())
# A success clears the backoff, and writes the destination's row only if there was one.
_CLEARED = (update(destinations)
            .where(destinations.c.id == bindparam("destination"),
                   or_(destinations.c.consecutive_failures != 0,
                       destinations.c.blocked_until.is_not(None)))
            .values(consecutive_failures=0, blocked_until=None))


def _locked(conn: Connection, destination_id: int) -> Any:
    """Return the destination's row, locked on PostgreSQL so that admissions serialise."""
    query = _ROW_LOCKED if conn.dialect.name == "postgresql" else _ROW
    return conn.execute(query, {"destination": destination_id}).one()


def in_flight(conn: Connection, row: Any, *, now: datetime) -> int:
    """Count the destination's requests in flight (up to its limit): open, not timed out."""
    since = now - timedelta(seconds=row.timeout_seconds + IN_FLIGHT_SLACK_SECONDS)
    return int(conn.execute(_IN_FLIGHT, {"destination": row.id, "since": since,
                                         "cap": row.max_in_flight}).scalar_one())


def admit(conn: Connection, destination_id: int, *, now: datetime,
          job: tuple[int, str, int] | None = None) -> Admission:
    """Decide whether the work item `job` (scope id, event id, attempt number) may be sent now.

    Admitted, it takes the next send slot at the destination's rate and its request is
    open (in flight) until answered. Refused, it should go back to the queue until
    `not_before` without spending an attempt.
    """
    row = _locked(conn, destination_id)
    if row.state != DestinationState.ACTIVE.value:
        return Admission(admitted=False, reason="paused")
    if row.blocked_until is not None and row.blocked_until > now:
        return Admission(admitted=False, reason="backoff", not_before=row.blocked_until)
    if in_flight(conn, row, now=now) >= row.max_in_flight:
        return Admission(admitted=False, reason="in_flight",
                         not_before=now + timedelta(seconds=IN_FLIGHT_WAIT_SECONDS))
    # Without a rate there is no slot to keep. (Moving one to `now` would refuse a worker
    # whose `now`, read before it waited for this row's lock, is a moment earlier.)
    if row.rate_per_second:
        if row.next_send_at is not None and row.next_send_at > now:
            return Admission(admitted=False, reason="rate", not_before=row.next_send_at)
        # Paced from the later of now and the last slot: an idle destination gets no burst
        # credit, and a backlog drains at exactly the rate.
        start = max(now, row.next_send_at or now)
        conn.execute(update(destinations).where(destinations.c.id == destination_id)
                     .values(next_send_at=start + timedelta(seconds=1.0 / row.rate_per_second)))
    if job is None:
        return Admission(admitted=True)
    opened = open_attempt(conn, destination_id, scope_id=job[0], event_id=job[1],
                          number=job[2], started_at=now)
    return Admission(admitted=True, attempt_id=opened)


def note_outcome(conn: Connection, destination_id: int, *, ok: bool, now: datetime,
                 ceiling: float = 0.0, retry_after: float | None = None) -> None:
    """Move the shared backoff: a success clears it; a failure holds the destination.

    `ceiling` is the hold after this failure (the worker's RetryPolicy.ceiling of the
    destination's consecutive failures); a Retry-After the destination sent holds it at
    least that long.
    """
    if ok:
        conn.execute(_CLEARED, {"destination": destination_id})
        return
    hold = max(ceiling, retry_after or 0.0)
    conn.execute(update(destinations).where(destinations.c.id == destination_id)
                 .values(consecutive_failures=destinations.c.consecutive_failures + 1,
                         blocked_until=now + timedelta(seconds=hold)))
