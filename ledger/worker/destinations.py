"""Destinations as the worker runs them: a handler for each claimed job a destination takes.

A job whose type has no Python handler here is looked up among the destinations (read
fresh for every such job or batch: a stale read would complete a destination's event as
`ignored:no-handler`). A destination's handler is `DestinationDelivery`'s two steps:
`prepare` admits, sends (no transaction open) and records the answer; `apply` runs in the
fenced completion transaction like any handler and returns the result_ref or raises
(PermanentFailure, RetryAfter, DeliveryError, or NotAdmitted: ledger.worker.outcome holds
the job back without spending an attempt).

One Forwarder (one pooled HTTP client) serves every worker loop of a process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, Engine

from ledger.destinations.delivery import DeliveryJob, DestinationDelivery, Prepared
from ledger.destinations.forward import Forwarder
from ledger.destinations.store import destinations_of, list_destinations
from ledger.handlers import Event
from ledger.services import Services
from ledger.worker.handlers import HandlerSpec, Registry
from ledger.worker.retry import RetryPolicy
from ledger.worker.store import WorkItem

MAX_PARALLEL_SENDS = 16  # a batch's requests sent at once (at most its size)

Key = tuple[int, str]


def new_delivery(services: Services, engine: Engine) -> DestinationDelivery:
    """Return the delivery of one process: one pooled forwarder under its settings."""
    settings = services.settings
    return DestinationDelivery(engine, services.box, Forwarder.from_settings(settings),
                               services.clock, retry=RetryPolicy.from_settings(settings))


def delivery_job(job: WorkItem, event: Event) -> DeliveryJob:
    """Return the claimed job as its destination's delivery needs it."""
    return DeliveryJob(scope=event.scope, scope_id=event.scope_id, event_id=event.event_id,
                       event_type=event.event_type, attempt=event.attempt, payload=job.payload,
                       leased_until=job.leased_until)


def delivery_spec(delivery: DestinationDelivery, job: WorkItem) -> HandlerSpec:
    """Return the handler that forwards this job's stored body to its destination."""

    def prepare(event: Event) -> Prepared:
        return delivery.prepare(delivery_job(job, event))

    def apply(conn: Connection, event: Event) -> str:
        return DestinationDelivery.apply(conn, event.prepared)

    return HandlerSpec(event_type=job.event_type, apply=apply, prepare=prepare)


def routed(conn: Connection, jobs: Iterable[WorkItem]) -> set[Key]:
    """Return the keys of the jobs a destination takes (one read of their scopes'
    destinations: a round costs the same whatever the number of destinations elsewhere)."""
    pending = list(jobs)
    if not pending:
        return set()
    by_scope = destinations_of(conn, {job.scope_id for job in pending})
    return {(job.scope_id, job.event_id) for job in pending
            if any(d.covers(job.event_type) for d in by_scope[job.scope_id])}


def handler_conflicts(conn: Connection, registry: Registry) -> list[str]:
    """Return a message per destination that takes a type this worker has a handler for."""
    handled = set(registry.types())
    found = []
    for destination in list_destinations(conn) if handled else ():
        both = sorted(handled if destination.event_types is None
                      else handled & set(destination.event_types))
        if both:
            found.append(f"destination {destination.public_id} takes event type(s) "
                         f"{', '.join(both)}, which a Python handler here handles too")
    return found


def send_pool() -> ThreadPoolExecutor:
    """Return a pool of threads for a worker loop's sends (MAX_PARALLEL_SENDS at once)."""
    return ThreadPoolExecutor(max_workers=MAX_PARALLEL_SENDS, thread_name_prefix="ledger-send")


def run_all(calls: list[Callable[[], Any]], pool: ThreadPoolExecutor | None = None) -> None:
    """Run the calls (each catches its own errors): several at once, on threads.

    `pool` is the worker loop's own (kept while it runs, so a round starts no threads);
    without one, the calls get a pool of their own.
    """
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    if pool is not None:
        for future in [pool.submit(call) for call in calls]:
            future.result()
        return
    with send_pool() as own:
        run_all(calls, own)


def read_routes(transaction: Callable[[], AbstractContextManager[Connection]],
                jobs: Iterable[WorkItem]) -> set[Key]:
    """Return `routed` read in a transaction of its own (none when no job asks)."""
    pending = list(jobs)
    if not pending:
        return set()
    with transaction() as conn:
        return routed(conn, pending)
