"""What every worker shares about a destination: its backoff, its rate, its requests in flight.

A failing destination must not burn each queued event's attempts (CONTRACT section 8): one
failure holds the whole destination (`blocked_until`), and its events wait behind it
without spending attempts. When it answers again, sends resume at `rate_per_second`
(`next_send_at` moves one interval per send) and at most `max_in_flight` at once.

Requests in flight are the destination's jobs under a live lease: a worker that dies
mid-request stops counting when its lease ends, so nothing leaks. `admit` decides for one
claimed job in its own short transaction, before the HTTP call and without holding any
lock across it (STYLE rule 7); `note_outcome` moves the backoff after the answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select, update

from ledger.db.schema import destinations, jobs
from ledger.destinations.store import DestinationState
from ledger.domain import JobStatus

# How long a job waits when the destination has no free request slot: short, as a slot
# frees when any request ends.
IN_FLIGHT_WAIT_SECONDS = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """Whether a job may be sent now; if not, why and the earliest moment to ask again."""

    admitted: bool
    reason: str | None = None  # "paused", "backoff", "in_flight", "rate"
    not_before: datetime | None = None  # None while paused: resume decides


def _locked(conn: Connection, destination_id: int) -> Any:
    """Return the destination's row, locked on PostgreSQL so that admissions serialise."""
    query = select(destinations).where(destinations.c.id == destination_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return conn.execute(query).one()


def in_flight(conn: Connection, row: Any, *, now: datetime,
              exclude: tuple[int, str] | None = None) -> int:
    """Count the destination's jobs under a live lease (`exclude`: the asking job)."""
    terms = [jobs.c.scope_id == row.integration_id, jobs.c.status == JobStatus.QUEUED.value,
             jobs.c.leased_until > now]
    if row.event_types is not None:
        terms.append(jobs.c.event_type.in_(_types(row)))
    if exclude is not None and exclude[0] == row.integration_id:
        terms.append(jobs.c.event_id != exclude[1])
    capped = select(jobs.c.event_id).where(*terms).limit(row.max_in_flight).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def _types(row: Any) -> list[str]:
    """Return the event types of a destinations row."""
    return list(json.loads(row.event_types))


def admit(conn: Connection, destination_id: int, *, now: datetime,
          job: tuple[int, str] | None = None) -> Admission:
    """Decide whether `job` (scope id, event id), claimed by this worker, may be sent now.

    Admitted, it takes the next send slot at the destination's rate. Refused, it should
    go back to the queue until `not_before` without spending an attempt.
    """
    row = _locked(conn, destination_id)
    if row.state != DestinationState.ACTIVE.value:
        return Admission(admitted=False, reason="paused")
    if row.blocked_until is not None and row.blocked_until > now:
        return Admission(admitted=False, reason="backoff", not_before=row.blocked_until)
    if in_flight(conn, row, now=now, exclude=job) >= row.max_in_flight:
        return Admission(admitted=False, reason="in_flight",
                         not_before=now + timedelta(seconds=IN_FLIGHT_WAIT_SECONDS))
    if row.next_send_at is not None and row.next_send_at > now:
        return Admission(admitted=False, reason="rate", not_before=row.next_send_at)
    step = 1.0 / row.rate_per_second if row.rate_per_second else 0.0
    # Paced from the later of now and the last slot: an idle destination gets no burst
    # credit, and a backlog drains at exactly the rate.
    start = max(now, row.next_send_at or now)
    conn.execute(update(destinations).where(destinations.c.id == destination_id)
                 .values(next_send_at=start + timedelta(seconds=step)))
    return Admission(admitted=True)


def note_outcome(conn: Connection, destination_id: int, *, ok: bool, now: datetime,
                 ceiling: float = 0.0, retry_after: float | None = None) -> None:
    """Move the shared backoff: a success clears it; a failure holds the destination.

    `ceiling` is the hold after this failure (the worker's RetryPolicy.ceiling of the
    destination's consecutive failures); a Retry-After the destination sent holds it at
    least that long.
    """
    if ok:
        conn.execute(update(destinations).where(destinations.c.id == destination_id)
                     .values(consecutive_failures=0, blocked_until=None))
        return
    hold = max(ceiling, retry_after or 0.0)
    conn.execute(update(destinations).where(destinations.c.id == destination_id)
                 .values(consecutive_failures=destinations.c.consecutive_failures + 1,
                         blocked_until=now + timedelta(seconds=hold)))
