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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func, or_, select, update

from ledger.db.schema import destination_attempts, destinations
from ledger.destinations.store import SENDING, DestinationState, open_attempts

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
    if job is None:  # the decision alone: no request is opened
        gate = _Gate(conn, _locked(conn, destination_id), now)
        refused = gate.take()
        gate.keep_rate()
        return refused or Admission(admitted=True)
    return admit_all(conn, destination_id, [job], now=now)[0]


def admit_all(conn: Connection, destination_id: int, jobs: Sequence[tuple[int, str, int]], *,
              now: datetime) -> list[Admission]:
    """Decide for several work items of one destination at once, as `admit` would one by one.

    One lock of the destination's row, one count of its requests in flight, one move of
    its rate slot and one insert of the admitted requests: each item sees the requests
    and slots the items before it took.
    """
    gate = _Gate(conn, _locked(conn, destination_id), now)
    refusals = [gate.take() for _ in jobs]
    gate.keep_rate()
    admitted = [job for job, refused in zip(jobs, refusals, strict=True) if refused is None]
    opened = iter(open_attempts(conn, destination_id, admitted, started_at=now))
    return [refused or Admission(admitted=True, attempt_id=next(opened)) for refused in refusals]


class _Gate:
    """A destination's limits as its locked row and its requests in flight set them."""

    def __init__(self, conn: Connection, row: Any, now: datetime) -> None:
        self._conn, self._row, self._now = conn, row, now
        self._in_flight: int | None = None  # counted when first needed
        self._next_send_at = row.next_send_at

    def take(self) -> Admission | None:
        """Take a request slot (None), or return why not and until when."""
        row, now = self._row, self._now
        if row.state != DestinationState.ACTIVE.value:
            return Admission(admitted=False, reason="paused")
        if row.blocked_until is not None and row.blocked_until > now:
            return Admission(admitted=False, reason="backoff", not_before=row.blocked_until)
        if self._in_flight is None:
            self._in_flight = in_flight(self._conn, row, now=now)
        if self._in_flight >= row.max_in_flight:
            return Admission(admitted=False, reason="in_flight",
                             not_before=now + timedelta(seconds=IN_FLIGHT_WAIT_SECONDS))
        # Without a rate there is no slot to keep. (Moving one to `now` would refuse a
        # worker whose `now`, read before it waited for this row's lock, is a moment earlier.)
        if row.rate_per_second:
            if self._next_send_at is not None and self._next_send_at > now:
                return Admission(admitted=False, reason="rate", not_before=self._next_send_at)
            # Paced from the later of now and the last slot: an idle destination gets no
            # burst credit, and a backlog drains at exactly the rate.
            start = max(now, self._next_send_at or now)
            self._next_send_at = start + timedelta(seconds=1.0 / row.rate_per_second)
        self._in_flight += 1
        return None

    def keep_rate(self) -> None:
        """Write the rate slot the admissions took (none taken: nothing written)."""
        if self._next_send_at != self._row.next_send_at:
            self._conn.execute(update(destinations)
                               .where(destinations.c.id == self._row.id)
                               .values(next_send_at=self._next_send_at))


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
