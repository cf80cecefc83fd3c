"""Destinations in the database: create, list, pause, resume, and the backoff they share.

Every function takes the caller's connection and never commits; every change an
operator makes appends its audit row in that same transaction. Signing secrets are in
ledger.destinations.secrets; what each attempt got back is written by `record_attempt`;
the backoff, rate and in-flight limits every worker shares are in
ledger.destinations.admission.

One destination per (integration, event type): a receipt completes with one
`result_ref`, so two destinations, or a destination and a Python handler, may not
both take a type (CONTRACT section 8).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Text,
    bindparam,
    column,
    delete,
    insert,
    select,
    text,
    update,
)

from ledger.access import audit
from ledger.access.secrets_box import SecretBox
from ledger.db import citus
from ledger.db.driver import DriverStatement
from ledger.db.schema import destination_attempts, destinations, integrations, jobs
from ledger.destinations.addresses import AddressPolicy, check_url
from ledger.destinations.secrets import add_secret
from ledger.domain import Integration, JobStatus
from ledger.errors import NotFound, Refused
from ledger.ids import DESTINATION_ID, EVENT_TYPE, new_destination_id

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 120.0
DEFAULT_MAX_IN_FLIGHT = 10
MAX_IN_FLIGHT = 1000
MAX_RATE_PER_SECOND = 10_000.0
MAX_URL_LENGTH = 2048
MAX_EVENT_TYPES = 100
# The outcome of a request sent and not answered yet (or whose worker died before it
# recorded the answer): requests in flight are these rows (ledger.destinations.admission).
SENDING = "sending"


class DestinationState(StrEnum):
    """A destination either takes its events or holds them (no attempt spent)."""

    ACTIVE = "active"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """One HTTP endpoint of an integration (without its secrets)."""

    id: int
    public_id: str
    integration_id: int
    integration_public_id: str
    url: str
    event_types: tuple[str, ...] | None  # None: every type
    state: DestinationState
    state_reason: str | None
    state_changed_at: datetime
    timeout_seconds: float
    max_in_flight: int
    rate_per_second: float | None
    consecutive_failures: int
    blocked_until: datetime | None
    next_send_at: datetime | None
    created_at: datetime

    def covers(self, event_type: str) -> bool:
        """Tell whether this destination takes events of `event_type`."""
        return self.event_types is None or event_type in self.event_types

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `destination list` item (never a secret)."""
        return {"destination": self.public_id, "integration": self.integration_public_id,
                "url": self.url, "event_types": list(self.event_types or []),
                "state": self.state.value, "created_at": self.created_at.isoformat()}

    @classmethod
    def from_row(cls, row: Any) -> Destination:
        """Build from a destinations row joined with its integration's public id."""
        types = json.loads(row.event_types) if row.event_types is not None else None
        return cls(id=row.id, public_id=row.public_id, integration_id=row.integration_id,
                   integration_public_id=row.integration_public_id, url=row.url,
                   event_types=tuple(types) if types is not None else None,
                   state=DestinationState(row.state), state_reason=row.state_reason,
                   state_changed_at=row.state_changed_at, timeout_seconds=row.timeout_seconds,
                   max_in_flight=row.max_in_flight, rate_per_second=row.rate_per_second,
                   consecutive_failures=row.consecutive_failures,
                   blocked_until=row.blocked_until, next_send_at=row.next_send_at,
                   created_at=row.created_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class DestinationSettings:
    """What an operator chooses at creation."""

    url: str
    event_types: Sequence[str] = ()  # empty: every type
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    rate_per_second: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewDestination:
    """A destination as created: the only moment its signing secret is shown."""

    destination: Destination
    signing_secret: str

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `destination create` object."""
        d = self.destination
        return {"destination": d.public_id, "integration": d.integration_public_id,
                "url": d.url, "event_types": list(d.event_types or []),
                "signing_secret": self.signing_secret}


def _select() -> Any:
    """Return the select of destinations with their integration's public id."""
    return (select(destinations, integrations.c.public_id.label("integration_public_id"))
            .join(integrations, integrations.c.id == destinations.c.integration_id))


def _checked_types(event_types: Sequence[str]) -> tuple[str, ...] | None:
    """Return the sorted distinct types (None for every type), refusing malformed ones."""
    if len(event_types) > MAX_EVENT_TYPES:
        raise Refused(f"at most {MAX_EVENT_TYPES} event types per destination")
    for event_type in event_types:
        if not isinstance(event_type, str) or not EVENT_TYPE.fullmatch(event_type):
            raise Refused(f"not an event type: {event_type!r}")
    return tuple(sorted(set(event_types))) or None


def _check_settings(settings: DestinationSettings, policy: AddressPolicy) -> None:
    """Refuse a URL or a limit out of range (Refused names it)."""
    if len(settings.url) > MAX_URL_LENGTH:
        raise Refused(f"a destination URL is at most {MAX_URL_LENGTH} characters")
    check_url(settings.url, policy)
    if not (math.isfinite(settings.timeout_seconds)
            and 0 < settings.timeout_seconds <= MAX_TIMEOUT_SECONDS):
        raise Refused(f"--timeout must be > 0 and <= {MAX_TIMEOUT_SECONDS:g} seconds")
    if not 1 <= settings.max_in_flight <= MAX_IN_FLIGHT:
        raise Refused(f"--max-in-flight must be between 1 and {MAX_IN_FLIGHT}")
    rate = settings.rate_per_second
    if rate is not None and not (math.isfinite(rate) and 0 < rate <= MAX_RATE_PER_SECOND):
        raise Refused(f"--rate must be > 0 and <= {MAX_RATE_PER_SECOND:g} per second")


def _refuse_overlaps(conn: Connection, integration: Integration, types: tuple[str, ...] | None,
                     handled_types: Collection[str]) -> None:
    """Refuse types that a Python handler or another destination of the integration takes."""
    handled = sorted(set(handled_types) if types is None else set(types) & set(handled_types))
    if handled:
        raise Refused("a Python handler takes event type(s) " + ", ".join(handled) +
                      ": a type has either a handler or a destination (use --event-type)")
    for other in list_destinations(conn, integration_id=integration.id):
        if other.event_types is None or types is None or set(other.event_types) & set(types):
            raise Refused(f"destination {other.public_id} already takes "
                          f"{'every type' if other.event_types is None else 'some of these types'}"
                          " of this integration")


def create_destination(conn: Connection, box: SecretBox, actor: audit.Actor,
                       integration: Integration, settings: DestinationSettings, *,
                       policy: AddressPolicy, handled_types: Collection[str],
                       now: datetime) -> NewDestination:
    """Create an active destination with a fresh signing secret; audited."""
    _check_settings(settings, policy)
    types = _checked_types(settings.event_types)
    _refuse_overlaps(conn, integration, types, handled_types)
    public_id = new_destination_id()
    row_id = conn.execute(insert(destinations).values(
        public_id=public_id, integration_id=integration.id, url=settings.url,
        event_types=json.dumps(list(types)) if types is not None else None,
        state=DestinationState.ACTIVE.value, state_changed_at=now,
        timeout_seconds=float(settings.timeout_seconds), max_in_flight=settings.max_in_flight,
        rate_per_second=settings.rate_per_second, consecutive_failures=0, created_at=now,
    ).returning(destinations.c.id)).scalar_one()
    secret, print_hmac = add_secret(conn, box, row_id, now=now)
    audit.record(conn, actor, "destination.create", public_id, at=now, scope=integration.scope,
                 detail={"integration": integration.public_id, "url": settings.url,
                         "event_types": list(types or []), "fingerprint": print_hmac,
                         "timeout_seconds": settings.timeout_seconds,
                         "max_in_flight": settings.max_in_flight,
                         "rate_per_second": settings.rate_per_second})
    return NewDestination(destination=get_destination(conn, public_id), signing_secret=secret)


def list_destinations(conn: Connection, *, integration_id: int | None = None
                      ) -> list[Destination]:
    """Return destinations (of one integration, or all), oldest first."""
    if integration_id is not None:
        return destinations_of(conn, [integration_id])[integration_id]
    return [Destination.from_row(r)
            for r in conn.execute(_select().order_by(destinations.c.id)).all()]


# Built once: a worker reads its round's scopes' destinations (or one scope's) per round.
_OF_INTEGRATIONS = (_select()
                    .where(destinations.c.integration_id.in_(bindparam("ids", expanding=True)))
                    .order_by(destinations.c.id))


def destinations_of(conn: Connection, integration_ids: Collection[int]
                    ) -> dict[int, list[Destination]]:
    """Return the destinations of these integrations, each one's oldest first (one read)."""
    found: dict[int, list[Destination]] = {i: [] for i in integration_ids}
    if found:
        for row in conn.execute(_OF_INTEGRATIONS, {"ids": sorted(found)}).all():
            found[row.integration_id].append(Destination.from_row(row))
    return found


def get_destination(conn: Connection, public_id: str) -> Destination:
    """Return the destination with this public id, or raise NotFound."""
    if not isinstance(public_id, str) or not DESTINATION_ID.fullmatch(public_id):
        raise NotFound("destination", str(public_id)[:64])
    row = conn.execute(_select().where(destinations.c.public_id == public_id)).first()
    if row is None:
        raise NotFound("destination", public_id)
    return Destination.from_row(row)


def destination_for(conn: Connection, scope_id: int, event_type: str) -> Destination | None:
    """Return the destination that takes this scope's events of `event_type`, or None."""
    for destination in list_destinations(conn, integration_id=scope_id):
        if destination.covers(event_type):
            return destination
    return None


# The type forwarded when the sender's Content-Type was absent or unusable, or the work
# item predates keeping it: that of the stored body's format.
JSON_CONTENT_TYPE = "application/json"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


_STORED_REQUEST = select(jobs.c.content_type, jobs.c.raw_body).where(
    jobs.c.scope_id == bindparam("scope"), jobs.c.event_id == bindparam("event"))
# The same, on the driver connection (see on_driver).
_DRIVER_STORED_REQUEST = DriverStatement(text(
    "SELECT content_type, raw_body FROM jobs WHERE scope_id = :scope AND event_id = :event"
).columns(column("content_type", Text), column("raw_body", Text)), what="a stored request")


def on_driver(bind: Connection | Engine) -> bool:
    """Tell whether a forwarded event's own statements run on the driver connection.

    Each forwarded event reads its stored request and records its answer: on PostgreSQL
    without Citus they skip SQLAlchemy's execution setup (ledger.db.driver), which cost
    about as much client CPU as the driver call, and a success is recorded in one
    statement, its own transaction, instead of a transaction of two. SQLite (no
    data-modifying WITH) and Citus run them as SQLAlchemy statements.
    """
    return bind.dialect.name == "postgresql" and not citus.distributed(bind.engine)


def stored_request(conn: Connection, scope_id: int, event_id: str,
                   payload: str | None) -> tuple[bytes, str]:
    """Return the body as received and its Content-Type, as the work item keeps them.

    A JSON sender's `payload` is its body as received; a form sender's is the decoded
    fields its handlers read, and the form as received is kept in `raw_body`.
    """
    params = {"scope": scope_id, "event": event_id}
    row = (_DRIVER_STORED_REQUEST.row(conn, params) if on_driver(conn)
           else conn.execute(_STORED_REQUEST, params).first())
    content_type, raw_body = (row.content_type, row.raw_body) if row is not None else (None, None)
    if raw_body is not None:
        return raw_body.encode(), content_type or FORM_CONTENT_TYPE
    return (payload or "").encode(), content_type or JSON_CONTENT_TYPE


def set_destination_state(conn: Connection, actor: audit.Actor, public_id: str,
                          state: DestinationState, *, reason: str,
                          now: datetime) -> Destination:
    """Pause or resume a destination with a reason; audited; refuses a no-op."""
    reason = (reason or "").strip()
    if not reason:
        raise Refused(f"a reason is required to {'pause' if state == 'paused' else 'resume'}")
    audit.check_reason(reason)
    current = get_destination(conn, public_id)
    changed = conn.execute(
        update(destinations)
        .where(destinations.c.id == current.id, destinations.c.state != state.value)
        .values(state=state.value, state_reason=reason, state_changed_at=now)
    ).rowcount
    if changed != 1:
        raise Refused(f"destination {public_id} is already {state.value}")
    if state is DestinationState.ACTIVE:
        release_held_jobs(conn, current, now=now)
    scope = conn.execute(select(integrations.c.account, integrations.c.name)
                         .where(integrations.c.id == current.integration_id)).one()
    audit.record(conn, actor, f"destination.{'pause' if state == 'paused' else 'resume'}",
                 public_id, at=now, scope=f"{scope.account}/{scope.name}", reason=reason,
                 detail={"integration": current.integration_public_id,
                         "previous_state": current.state.value})
    return get_destination(conn, public_id)


# Built once, as every forwarded event opens and answers one (the values come with each
# execution; the attempt's id is bound as `attempt`, apart from the columns set).
_OPEN_ATTEMPT = insert(destination_attempts).returning(destination_attempts.c.id)
# Several at once, their ids returned in the order of the rows given.
_OPEN_ATTEMPTS = insert(destination_attempts).returning(destination_attempts.c.id,
                                                         sort_by_parameter_order=True)
_ANSWER_ATTEMPT = update(destination_attempts).where(
    destination_attempts.c.id == bindparam("attempt"))


def open_attempt(conn: Connection, destination_id: int, *, scope_id: int, event_id: str,
                 number: int, started_at: datetime) -> int:
    """Keep an admitted request as `sending` until its answer: it counts as in flight."""
    return int(conn.execute(_OPEN_ATTEMPT, {
        "destination_id": destination_id, "scope_id": scope_id, "event_id": event_id,
        "number": number, "started_at": started_at, "latency_ms": 0.0, "outcome": SENDING,
    }).scalar_one())


def open_attempts(conn: Connection, destination_id: int, jobs: Sequence[tuple[int, str, int]],
                  *, started_at: datetime) -> list[int]:
    """Open a `sending` attempt for each (scope id, event id, number): their ids, in order."""
    if not jobs:
        return []
    if len(jobs) == 1:
        (scope_id, event_id, number), = jobs
        return [open_attempt(conn, destination_id, scope_id=scope_id, event_id=event_id,
                             number=number, started_at=started_at)]
    rows = conn.execute(_OPEN_ATTEMPTS, [
        {"destination_id": destination_id, "scope_id": scope_id, "event_id": event_id,
         "number": number, "started_at": started_at, "latency_ms": 0.0, "outcome": SENDING}
        for scope_id, event_id, number in jobs]).all()
    return [int(row.id) for row in rows]


def answer_attempt(conn: Connection, attempt_id: int, *, latency_ms: float,
                   http_status: int | None, outcome: str, error: str | None,
                   response_excerpt: str | None) -> None:
    """Replace an open request's `sending` by what the destination answered."""
    conn.execute(_ANSWER_ATTEMPT, {
        "attempt": attempt_id, "latency_ms": latency_ms, "http_status": http_status,
        "outcome": outcome, "error": error, "response_excerpt": response_excerpt})


# A success's answer and the clearing of its destination's backoff (as admission's
# note_outcome clears it: only when there is one), in one statement (on_driver).
_DRIVER_ANSWERED_AND_CLEARED = DriverStatement(text("""
WITH answered AS (
    UPDATE destination_attempts
    SET latency_ms = :latency_ms, http_status = :http_status, outcome = :outcome,
        error = :error, response_excerpt = :response_excerpt
    WHERE id = :attempt
)
UPDATE destinations SET consecutive_failures = 0, blocked_until = NULL
WHERE id = :destination AND (consecutive_failures != 0 OR blocked_until IS NOT NULL)
"""), what="a destination's answer")


def answer_success(engine: Engine, attempt_id: int, destination_id: int, *,
                   latency_ms: float, http_status: int | None, outcome: str,
                   response_excerpt: str | None) -> None:
    """Record a successful answer and clear its destination's backoff: one statement, a
    transaction of its own.

    Only where on_driver holds; elsewhere answer_attempt and admission's note_outcome.
    """
    _DRIVER_ANSWERED_AND_CLEARED.execute_alone(engine, {
        "attempt": attempt_id, "destination": destination_id, "latency_ms": latency_ms,
        "http_status": http_status, "outcome": outcome, "error": None,
        "response_excerpt": response_excerpt})


def release_held_jobs(conn: Connection, destination: Destination, *, now: datetime) -> int:
    """Make the destination's waiting events due now (a resume): they drain at its limits.

    Work items under a lease are left alone; one that a worker holds back while this commits
    comes again after that worker's paused hold (ledger.worker.outcome.hold_back).
    """
    terms = [jobs.c.scope_id == destination.integration_id,
             jobs.c.status == JobStatus.QUEUED.value, jobs.c.run_at > now,
             jobs.c.leased_until.is_(None)]
    if destination.event_types is not None:
        terms.append(jobs.c.event_type.in_(destination.event_types))
    return int(conn.execute(update(jobs).where(*terms).values(run_at=now)).rowcount)


def record_attempt(conn: Connection, destination_id: int, *, scope_id: int, event_id: str,
                   number: int, started_at: datetime, latency_ms: float,
                   http_status: int | None, outcome: str, error: str | None,
                   response_excerpt: str | None) -> None:
    """Keep what the destination answered to attempt `number` of a receipt."""
    conn.execute(insert(destination_attempts).values(
        destination_id=destination_id, scope_id=scope_id, event_id=event_id, number=number,
        started_at=started_at, latency_ms=latency_ms, http_status=http_status,
        outcome=outcome, error=error, response_excerpt=response_excerpt))


def purge_attempts(conn: Connection, *, before: datetime) -> int:
    """Delete the answers of attempts started before `before` (the retention purge's cut).

    Per destination, so each delete walks ix_destination_attempts_started. Attempts end
    within the event's retry window, far inside the receipts' retention, so an answer
    never outlives its receipt by more than that window.
    """
    count = 0
    for destination_id in conn.execute(select(destinations.c.id)).scalars().all():
        count += conn.execute(
            delete(destination_attempts)
            .where(destination_attempts.c.destination_id == destination_id,
                   destination_attempts.c.started_at < before)).rowcount
    return count
