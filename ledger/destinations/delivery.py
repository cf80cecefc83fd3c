"""A destination run as a handler: `prepare` sends, `apply` turns the answer into an outcome.

The worker calls `prepare` after its claim, outside the completion transaction: it finds
the event's destination, asks `admit_all` (pause, backoff, in flight, rate) in one short
transaction (for a round of several events, `admit_round` has done that for all of them in
one), makes the HTTP call with no transaction open (STYLE rule 7), then records the answer
and moves the shared backoff in a second short transaction. The answer is
recorded there, not in `apply`, because a raising `apply` rolls back everything written
through its connection, and the request did happen whatever the worker does next.

`apply` runs in the fenced completion transaction and only returns the `result_ref` or
raises: PermanentFailure, RetryAfter, DeliveryError (the worker's own backoff), or
NotAdmitted, which asks the worker to put the work item back until `not_before` without
spending an attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from ledger.access.secrets_box import SecretBox
from ledger.clock import Clock
from ledger.destinations.admission import Admission, admit_all, note_outcome
from ledger.destinations.forward import (
    Forwarder,
    ForwardEvent,
    ForwardResult,
    ForwardTarget,
    Outcome,
)
from ledger.destinations.secrets import live_secrets
from ledger.destinations.store import (
    Destination,
    answer_attempt,
    answer_success,
    destination_for,
    on_driver,
    stored_request,
)
from ledger.worker.retry import RetryPolicy

# The attribute naming the failure group of a destination's failed delivery: the
# destination, in place of the event type (ledger.worker.failure_groups).
FAILURE_GROUP = "failure_group"


def failure_group_of(error: BaseException | None) -> str | None:
    """Return the failure group a destination's failure belongs to, or None (the type's)."""
    group = getattr(error, FAILURE_GROUP, None)
    return group if isinstance(group, str) else None


class NotAdmitted(Exception):
    """The destination may not be sent to now: requeue until `not_before`, no attempt spent.

    `not_before` is None while the destination is paused: resuming it decides.
    """

    def __init__(self, reason: str, not_before: datetime | None) -> None:
        super().__init__(f"destination {reason}")
        self.reason = reason
        self.not_before = not_before


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryJob:
    """The claimed event as a destination needs it (its stored body and type are read)."""

    scope: str
    scope_id: int
    event_id: str
    event_type: str
    attempt: int  # the attempt's number in the receipt's history (X-Ledger-Attempt)
    payload: str | None  # the work item's payload: the body as received unless it was a form
    leased_until: datetime | None = None  # the worker's lease on it: the send ends before


# Decrypted destination secrets a worker process keeps (a destination has one, two in a
# rotation's overlap).
DECRYPTED_SECRETS = 1024

# Of a work item's lease, what a send leaves for recording its answer and completing.
LEASE_MARGIN_SECONDS = 5.0
MIN_SEND_SECONDS = 1.0


def send_timeout(timeout: float, leased_until: datetime | None, now: datetime) -> float:
    """Return the send's timeout: the destination's, cut to end inside the work item's lease.

    A send that outlasted the lease would let another worker claim the work item and send
    it again while the first request is still open (its completion is fenced, but the
    destination would be called twice). A destination slower than the lease needs a longer
    LEDGER_LEASE_SECONDS.
    """
    if leased_until is None:
        return timeout
    left = (leased_until - now).total_seconds() - LEASE_MARGIN_SECONDS
    return min(timeout, max(left, MIN_SEND_SECONDS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """What `prepare` did: no destination, not admitted, or sent with this result."""

    destination: Destination | None
    admission: Admission | None = None
    result: ForwardResult | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Admitted:
    """One job's admission: its destination (None: none takes it), the decision, and for an
    admitted job the secrets that sign and the request to send."""

    now: datetime
    destination: Destination | None = None
    admission: Admission | None = None
    secrets: Sequence[str] = ()
    request: tuple[bytes, str] | None = None


def _key(job: DeliveryJob) -> tuple[int, str, int]:
    return job.scope_id, job.event_id, job.attempt


class DestinationDelivery:
    """Runs the destinations of one worker process over one pooled forwarder."""

    def __init__(self, engine: Engine, box: SecretBox, forwarder: Forwarder, clock: Clock,
                 *, retry: RetryPolicy) -> None:
        self._engine = engine
        # Every send reads its destination's live secrets; each is decrypted once per
        # process (keyed by its ciphertext: a rotated or re-encrypted secret is a new entry).
        self._decrypt = lru_cache(maxsize=DECRYPTED_SECRETS)(box.decrypt)
        self._forwarder = forwarder
        self._clock = clock
        self._retry = retry
        # What a round's admission decided, until each job's prepare takes its own.
        self._admitted: dict[tuple[int, str, int], _Admitted] = {}

    def close(self) -> None:
        """Close the forwarder's pooled connections."""
        self._forwarder.close()

    def admit_round(self, jobs: Sequence[DeliveryJob]) -> None:
        """Admit a round's jobs in one transaction; each job's `prepare` then only sends.

        The jobs of one destination are admitted together (`admit_all`: each sees the
        requests and rate slots of the ones before it), destinations in id order (two
        workers' rounds lock their rows in one order), and each destination's secrets are
        read once. A round whose admission fails (the database) leaves every job to admit
        itself in `prepare`.
        """
        now = self._clock.now()
        admitted: dict[tuple[int, str, int], _Admitted] = {}
        try:
            with self._engine.begin() as conn:
                for destination, group in self._by_destination(conn, jobs):
                    admitted.update(self._admit_group(conn, destination, group, now))
        except sa_exc.SQLAlchemyError:  # the database: each prepare admits its job alone
            return
        self._admitted.update(admitted)

    def prepare(self, job: DeliveryJob) -> Prepared:
        """Admit (unless its round did), send and record one attempt; never holds a
        transaction across the call."""
        found = self._admitted.pop(_key(job), None)
        if found is None:
            now = self._clock.now()
            with self._engine.begin() as conn:
                destination = destination_for(conn, job.scope_id, job.event_type)
                found = self._admit_group(conn, destination, [job], now)[_key(job)]
        destination, admission = found.destination, found.admission
        if destination is None or admission is None or not admission.admitted:
            return Prepared(destination=destination, admission=admission)
        assert found.request is not None  # an admitted job's request was read with it
        body, content_type = found.request
        result = self._forwarder.forward(
            ForwardTarget(url=destination.url, secrets=found.secrets,
                          timeout_seconds=send_timeout(destination.timeout_seconds,
                                                       job.leased_until, found.now)),
            ForwardEvent(scope=job.scope, event_id=job.event_id, event_type=job.event_type,
                         attempt=job.attempt), body, content_type, now=found.now)
        self._record(destination, admission, result)
        return Prepared(destination=destination, admission=admission, result=result)

    @staticmethod
    def _by_destination(conn: Connection, jobs: Sequence[DeliveryJob]
                        ) -> list[tuple[Destination | None, list[DeliveryJob]]]:
        """Return the jobs grouped by the destination that takes them, in destination order."""
        found: dict[tuple[int, str], Destination | None] = {}
        groups: dict[int, tuple[Destination | None, list[DeliveryJob]]] = {}
        for job in jobs:
            route = (job.scope_id, job.event_type)
            if route not in found:
                found[route] = destination_for(conn, job.scope_id, job.event_type)
            destination = found[route]
            key = destination.id if destination is not None else 0
            groups.setdefault(key, (destination, []))[1].append(job)
        return [groups[key] for key in sorted(groups)]

    def _admit_group(self, conn: Connection, destination: Destination | None,
                     jobs: Sequence[DeliveryJob], now: datetime
                     ) -> dict[tuple[int, str, int], _Admitted]:
        """Admit one destination's jobs in `conn`'s transaction; read the admitted ones'
        secrets (once) and requests."""
        if destination is None:
            return {_key(job): _Admitted(now=now) for job in jobs}
        admissions = admit_all(conn, destination.id, [_key(job) for job in jobs], now=now)
        secrets: list[str] | None = None
        found = {}
        for job, admission in zip(jobs, admissions, strict=True):
            if not admission.admitted:
                found[_key(job)] = _Admitted(now=now, destination=destination,
                                             admission=admission)
                continue
            if secrets is None:
                secrets = live_secrets(conn, self._decrypt, destination.id, now=now)
            found[_key(job)] = _Admitted(
                now=now, destination=destination, admission=admission, secrets=secrets,
                request=stored_request(conn, job.scope_id, job.event_id, job.payload))
        return found

    def _record(self, destination: Destination, admission: Admission,
                result: ForwardResult) -> None:
        """Keep the answer with the attempt and move the destination's shared backoff.

        The hold after the n-th failure in a row is the worker's retry ceiling for n, with
        no jitter: one hold for all of the destination's events.
        """
        ok = result.outcome is Outcome.COMPLETE
        assert admission.attempt_id is not None
        if ok and on_driver(self._engine):
            answer_success(self._engine, admission.attempt_id, destination.id,
                           latency_ms=result.latency_ms, http_status=result.http_status,
                           outcome=result.outcome.value, response_excerpt=result.response_excerpt)
            return
        with self._engine.begin() as conn:
            answer_attempt(conn, admission.attempt_id, latency_ms=result.latency_ms,
                           http_status=result.http_status, outcome=result.outcome.value,
                           error=result.error, response_excerpt=result.response_excerpt)
            # A 4xx that fails one event says nothing about the destination's health.
            if result.outcome is not Outcome.FAILED:
                note_outcome(conn, destination.id, ok=ok, now=self._clock.now(),
                             ceiling=self._retry.ceiling(destination.consecutive_failures + 1),
                             retry_after=result.retry_after)

    @staticmethod
    def apply(_conn: Connection, prepared: Prepared) -> str:
        """Return the result_ref of a delivered event, or raise what the worker must do."""
        if prepared.result is not None:
            try:
                return prepared.result.result_ref_or_raise()
            except Exception as error:
                assert prepared.destination is not None
                # A failing destination is one problem, whatever its events' types.
                setattr(error, FAILURE_GROUP, f"destination {prepared.destination.public_id}")
                raise
        admission = prepared.admission
        if admission is not None and not admission.admitted:
            raise NotAdmitted(admission.reason or "held", admission.not_before)
        raise LookupError("no destination takes this event")
