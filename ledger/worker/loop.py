"""The worker: claim due work items, run their handlers, commit each outcome exactly once.

The one path of a worker is ledger.worker.batch: claim up to LEDGER_WORKER_BATCH
work items (rows of the `jobs` table) in a transaction of their own, run their
handlers' prepare steps with no transaction open, then run the handlers and
complete the items in one fenced transaction, which inside `run` also claims
the next round. `process_one` is the same path with a batch of one. This module
holds what that path runs on: the worker's connection and transactions, its
claim request, scope names, the start and end of each attempt (logged and
counted once its transaction committed), and the loop.

If a handler raises, its writes roll back and its failed attempt records the
error (class and message, never the payload) and schedules a full-jitter retry,
or makes the receipt `failed` at LEDGER_MAX_ATTEMPTS / LEDGER_MAX_EVENT_AGE_SECONDS.
A worker that dies leaves its work items leased until `run_at` (the lease's end)
passes; the next claim marks the lost attempt and counts a new one, so an item
that keeps killing workers still reaches `failed`.

A work item whose type has no Python handler here, and that a destination takes, runs
the destination as its handler (ledger.worker.destinations): its prepare step is the
HTTP request, made with no transaction open; a destination that does not admit the
request (paused, backing off, at its rate or in-flight limit) has the item put back
without spending an attempt (ledger.worker.outcome.hold_back).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from ledger import metrics
from ledger.access.integrations import get_integration_by_id, scope_names
from ledger.config import default_worker_batch
from ledger.db import citus
from ledger.db.engine import connection_is_alive, is_unavailable, make_engine
from ledger.destinations.delivery import DestinationDelivery
from ledger.errors import NotFound, error_summary
from ledger.logs import event_ref, get_logger
from ledger.scheduling.instances import live_handled_types, new_instance_id
from ledger.services import Services
from ledger.worker import batch
from ledger.worker.destinations import (
    delivery_job,
    delivery_spec,
    new_delivery,
    read_routes,
    send_pool,
)
from ledger.worker.handlers import Event, HandlerSpec, Registry, load_registry
from ledger.worker.outcome import COMPLETE, FENCED, Outcome, record_failed_attempt
from ledger.worker.retry import RandomSource, RetryPolicy
from ledger.worker.store import (
    ClaimLimits,
    ClaimRequest,
    Lease,
    WorkItem,
    fail_unstarted,
    hold_lease,
    relock_due,
    set_job_failed,
)

log = get_logger("ledger.worker")
_stdlib_log = logging.getLogger("ledger.worker")  # its level decides the debug lines
POLL_SECONDS = 0.5
MAX_IDLE_BACKOFF_SECONDS = 30.0
STORAGE_RETRY_SECONDS = 0.5  # mean wait between retries while the database is away
BURST_ERROR_LIMIT = 5
BURST_OUTAGE_LIMIT = 30  # retries (~15 s) a --burst worker gives a database that is away
LIVE_TYPES_TTL = 1.0  # seconds a worker trusts its read of the live workers' event types
# The attempt metrics' event_type label of work items no Python handler here ran.
UNHANDLED, FORWARDED = "unhandled", "forwarded"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerHooks:
    """Observation points for crash tests: inside the completion transaction, and after it."""

    before_commit: Callable[[Connection, Event], None] | None = None
    after_commit: Callable[[Event], None] | None = None


def is_storage_error(error: BaseException) -> bool:
    """Tell whether an attempt failed because of the database (connection, server, disk)."""
    return is_unavailable(error) or isinstance(error, sa_exc.OperationalError)


class Worker:
    """Claims and runs work items against one database."""

    is_storage_error = staticmethod(is_storage_error)

    def __init__(self, services: Services, *, worker_id: str | None = None,
                 handlers: Registry | None = None, rng: RandomSource | None = None,
                 hooks: WorkerHooks | None = None, engine: Engine | None = None,
                 batch_size: int | None = None,
                 delivery: DestinationDelivery | None = None) -> None:
        self.services = services
        self.engine = engine or services.engine
        self.worker_id = worker_id or new_instance_id()
        self.registry = handlers if handlers is not None else load_registry(services.settings)
        self.policy = RetryPolicy.from_settings(services.settings)
        self.rng = rng or random.SystemRandom()
        self.hooks = hooks or WorkerHooks()
        self._scopes: dict[int, str] = {}
        self._counters: dict[tuple[str, str], Any] = {}  # ATTEMPTS children by labels
        self._stop: threading.Event | None = None  # set inside run(): completions may chain
        self._held: Connection | None = None  # run()'s connection: no pool checkout per job
        self.attempt_started: float | None = None  # perf_counter at claim: attempt latency
        # Attempts a database error cut off, until handed back: (item, scope, error) each.
        self.interrupted: list[tuple[WorkItem, str, str]] = []
        # Work items per claim and per commit (ledger.worker.batch). A distributed
        # (Citus) ledger claims one item per statement by key (see round_size).
        self.batch_size = (batch_size or services.settings.worker_batch
                           or default_worker_batch(self.engine.dialect.name))
        self.alone_types = tuple(t for t in self.registry.types()
                                 if (spec := self.registry.get(t)) and spec.prepare)
        self.next_batch: list[Lease] = []  # the round the last round's commit claimed
        self._live_types: tuple[float, set[str]] | None = None  # (monotonic read, types)
        # Destinations' deliveries: shared by run_worker's loops, else made on first need.
        self._delivery = delivery
        self._owns_delivery = False
        # The threads of a round's sends, kept while `run` loops (ledger.worker.destinations).
        self.sends: ThreadPoolExecutor | None = None
        self._autocommit = (self.engine.execution_options(isolation_level="AUTOCOMMIT")
                            if self.engine.dialect.name == "postgresql" else None)

    def process_one(self) -> bool:
        """Claim and run one due work item (the worker's one path, a batch of one).

        False when none is due. A round the last completion claimed runs first.
        """
        return batch.process_batch(self, 1) > 0

    def claim_request(self, size: int | None = None) -> ClaimRequest:
        """Return this worker's claim of its next `size` (default: a round's) work items, now."""
        now = self.services.clock.now()
        return ClaimRequest(worker_id=self.worker_id, now=now, limits=self._limits(now),
                            lease_seconds=self.services.settings.lease_seconds,
                            size=size or self.round_size(), alone_types=self.alone_types)

    def round_size(self) -> int:
        """Return how many work items a round claims (asked per claim: the layout is read once)."""
        return 1 if citus.distributed(self.engine) else self.batch_size

    def named(self, conn: Connection, leases: list[Lease]) -> list[Lease]:
        """Return the leases with their scopes' names, read while the claim's transaction is
        open (those not cached in one statement)."""
        self.cache_scopes(conn, (lease.due.scope_id for lease in leases))
        return [lease.named(self._scope(conn, lease.due.scope_id)) for lease in leases]

    def start_attempt(self, lease: Lease) -> WorkItem | None:
        """Start a leased attempt, or end a work item that may not start (then None)."""
        item = lease.item
        if item is None:
            self._end_unstarted(lease)
            return None
        if item.lost:
            self._log_lost(item, lease.scope)
        # The attempt's start is in its attempts row (worker, time); at INFO one
        # line per attempt, when it ends, is the transition an operator reads.
        if _stdlib_log.isEnabledFor(logging.DEBUG):
            self._transition(item, lease.scope, "queued", "running", level=logging.DEBUG)
        return item

    def _log_lost(self, job: WorkItem, scope: str) -> None:
        """Log the attempt(s) this claim found abandoned by a worker that vanished."""
        self._log("job.transition", scope=scope, event_id=job.event_id,
                  event_type=job.event_type, attempt=job.number - 1, from_state="running",
                  to_state="lost", outcome="lost", lost_attempts=job.lost,
                  accepted_at=job.accepted_at)
        self._count(job.event_type, "lost", terminal=False)

    def claim_connection(self) -> AbstractContextManager[Connection]:
        """Return the claim's transaction: one statement in autocommit on PostgreSQL.

        The PostgreSQL claim is a single statement, hence atomic on its own:
        autocommit saves the BEGIN and COMMIT round trips. SQLite runs several
        statements inside the engine's BEGIN IMMEDIATE, and so does a distributed
        (Citus) ledger's claim by key. Inside `run` the claim takes the loop's own
        connection (most claims ride on a completion there).
        """
        if (self._autocommit is not None and self._held is None
                and not citus.distributed(self.engine)):
            return self._autocommit.connect()
        return self.transaction()

    def transaction(self) -> AbstractContextManager[Connection]:
        """Begin a transaction: on the loop's own connection inside `run`, else from the pool."""
        if self._held is not None:
            return _begun(self._held)
        return self.engine.begin()

    def _end_unstarted(self, lease: Lease) -> None:
        """End a claimed work item that may not start (out of attempts, too old) or has no
        receipt."""
        due, scope, now = lease.due, lease.scope, lease.claimed_at
        refusal = self.policy.refuse_to_start(due.attempts + 1, now=now,
                                              window_start=due.window_start)
        with self.transaction() as conn:
            if not relock_due(conn, due):
                return  # another worker ended it meanwhile
            if refusal is not None:
                fail_unstarted(conn, due, worker_id=self.worker_id, reason=refusal, now=now)
            else:  # a job without a receipt: park it, never loop on it
                set_job_failed(conn, due.scope_id, due.event_id)
        self._log("job.transition", scope=scope, event_id=due.event_id,
                  event_type=due.event_type, attempt=due.attempts + 1,
                  accepted_at=due.window_start, from_state="queued", to_state="failed",
                  outcome="not-run", reason=refusal or "orphan job: no receipt")
        self._count(due.event_type, "not-run", terminal=True)

    def _limits(self, now: datetime) -> ClaimLimits:
        """Return the retry policy's refuse_to_start as the claim checks it."""
        oldest = now - timedelta(seconds=self.policy.max_event_age_seconds)
        return ClaimLimits(max_attempts=self.policy.max_attempts, oldest_window=oldest)

    def cache_scopes(self, conn: Connection, scope_ids: Iterable[int]) -> None:
        """Read the names of the scopes not cached yet, in one statement (a batch's).

        A worker names a job's scope once per scope; with many scopes a batch's jobs
        would mostly be misses, one query each.
        """
        missing = {scope_id for scope_id in scope_ids if scope_id not in self._scopes}
        if missing:
            self._scopes.update({i: n.scope for i, n in scope_names(conn, missing).items()})

    def _scope(self, conn: Connection, scope_id: int) -> str:
        """Return `account/integration` of a scope id (cached: it never changes)."""
        scope = self._scopes.get(scope_id)
        if scope is None:
            try:
                scope = get_integration_by_id(conn, scope_id).scope
            except NotFound:  # never expected; must not wedge the queue's head
                scope = f"#{scope_id}"
            self._scopes[scope_id] = scope
        return scope

    def event_of(self, job: WorkItem, scope: str) -> Event:
        """Build the handler's view of the job."""
        payload = json.loads(job.payload) if job.payload is not None else None
        if not isinstance(payload, dict):
            raise ValueError("the job's payload is missing or not a JSON object")
        return Event(scope=scope, scope_id=job.scope_id, event_id=job.event_id,
                     event_type=job.event_type, payload=payload, attempt=job.number,
                     accepted_at=job.accepted_at)

    def chaining(self) -> bool:
        """Tell whether a completion claims the next round too (inside `run`, not stopping)."""
        return self._stop is not None and not self._stop.is_set()

    def record_interruptions(self) -> None:
        """Hand back every attempt a database error cut off, oldest first."""
        while self.interrupted:
            self._record_interruption(self.interrupted[0])
            self.interrupted.pop(0)

    def _record_interruption(self, interrupted: tuple[WorkItem, str, str]) -> None:
        """Put back the attempt a database error cut off: it spends time, not an attempt.

        A connection killed, a restart, a full disk or a lock timeout during the
        completion is no fault of the handler, so its attempt is handed back
        (jobs.attempts - 1; the receipt's history keeps the attempt, outcome
        `interrupted`) and the job is due again after a full-jitter wait that
        grows with that history; the event's age still ends it. If the database
        is still away this raises and the worker tries again before its next
        claim (the lease keeps the job ours meanwhile).
        """
        job, scope, summary = interrupted
        now = self.services.clock.now()
        with self.transaction() as conn:
            # Not held: taken over, or the completion did commit after all.
            outcome = record_failed_attempt(
                conn, job, None, summary, policy=self.policy, rng=self.rng, now=now,
            ) if hold_lease(conn, job) else FENCED
        self.report(job, scope, outcome)

    def destination_specs(self, jobs: list[WorkItem]) -> dict[tuple[int, str], HandlerSpec]:
        """Return the destination handler of each job (without a Python one) a destination takes."""
        keys = read_routes(self.transaction, jobs)
        if not keys:
            return {}
        if self._delivery is None:
            self._delivery, self._owns_delivery = new_delivery(self.services, self.engine), True
        return {(job.scope_id, job.event_id): delivery_spec(self._delivery, job)
                for job in jobs if (job.scope_id, job.event_id) in keys}

    def admit_round(self, sends: list[tuple[WorkItem, Event]]) -> None:
        """Admit a round's forwarded jobs together (DestinationDelivery.admit_round)."""
        if self._delivery is not None:
            self._delivery.admit_round([delivery_job(job, event) for job, event in sends])

    def handled_elsewhere(self, event_type: str) -> bool:
        """Tell whether a live worker instance has the handler this worker lacks.

        Read at most once per LIVE_TYPES_TTL: only jobs without a handler here ask.
        """
        read = self._live_types
        if read is None or time.monotonic() - read[0] > LIVE_TYPES_TTL:
            try:
                with self.transaction() as conn:
                    types = live_handled_types(
                        conn, now=self.services.clock.now(),
                        within_seconds=self.services.settings.revocation_bound_seconds)
            except Exception as error:
                if not is_storage_error(error):
                    raise
                return True  # unsure: never drop an event another worker might handle
            read = self._live_types = (time.monotonic(), types)
        return event_type in read[1]

    def report(self, job: WorkItem, scope: str, outcome: Outcome,
               event: Event | None = None, *, forwarded: bool = False) -> None:
        """Log and count how an attempt ended, once its transaction committed (both paths).

        `forwarded`: a destination ran the work item (no Python handler here).
        """
        extra: dict[str, Any] = {name: value for name, value in (
            ("error", outcome.error), ("reason", outcome.reason),
            ("retry_in_seconds", outcome.retry_in)) if value is not None}
        self._transition(job, scope, "running", outcome.to_state, outcome=outcome.outcome,
                         forwarded=forwarded, **extra)
        if outcome is COMPLETE and event is not None and self.hooks.after_commit is not None:
            self.hooks.after_commit(event)

    def _transition(self, job: WorkItem, scope: str, from_state: str, to_state: str, *,
                    outcome: str | None = None, level: int = logging.INFO,
                    forwarded: bool = False, **extra: Any) -> None:
        """Log one state transition and count the attempt's outcome."""
        if outcome is not None:
            extra["outcome"] = outcome
            if self.attempt_started is not None:
                extra["latency_ms"] = round(
                    (time.perf_counter() - self.attempt_started) * 1000, 2)
        self._log("job.transition", scope=scope, event_id=job.event_id, level=level,
                  event_type=job.event_type, attempt=job.number, from_state=from_state,
                  to_state=to_state, accepted_at=job.accepted_at, **extra)
        if outcome is not None:
            self._count(job.event_type, outcome, terminal=to_state == "failed",
                        forwarded=forwarded)

    def _log(self, message: str, *, scope: str, event_id: str, level: int = logging.INFO,
             accepted_at: datetime | None = None, **fields: Any) -> None:
        """Write a structured line: a keyed hash instead of the event id, never the payload."""
        if accepted_at is not None:
            age = (self.services.clock.now() - accepted_at).total_seconds()
            fields["event_age_seconds"] = round(age, 3)
        log.log(level, message, scope=scope, event_ref=event_ref(scope, event_id),
                worker_id=self.worker_id, **fields)

    def _count(self, event_type: str, outcome: str, *, terminal: bool,
               forwarded: bool = False) -> None:
        """Update the attempt metrics. Event types without a Python handler share one label
        (their number is the senders' to choose): FORWARDED when a destination ran the work
        item, else UNHANDLED."""
        label = (event_type if self.registry.get(event_type) is not None
                 else FORWARDED if forwarded else UNHANDLED)
        counter = self._counters.get((label, outcome))
        if counter is None:  # labels() takes a lock and builds its key: once per pair
            counter = self._counters[(label, outcome)] = metrics.ATTEMPTS.labels(
                event_type=label, outcome=outcome)
        counter.inc()
        if terminal:
            metrics.TERMINAL_FAILURES.labels(event_type=label).inc()

    def run(self, *, burst: bool = False, stop: threading.Event | None = None,
            poll_seconds: float = POLL_SECONDS) -> int:
        """Process jobs until `stop` is set (or, with burst, until none is due)."""
        stop = stop or threading.Event()
        self._stop = stop  # lets a completion claim the next round (ledger.worker.batch)
        self.sends = send_pool()  # the rounds' sends share its threads while the loop runs
        try:
            return self._loop(burst=burst, stop=stop, poll_seconds=poll_seconds)
        finally:
            self._stop = None
            self.sends.shutdown()
            self.sends = None
            self._release()
            if self._owns_delivery and self._delivery is not None:
                self._delivery.close()
                self._delivery, self._owns_delivery = None, False

    def _hold_live_connection(self) -> None:
        """Take the loop's connection, or a fresh one if the server closed it while idle."""
        if self._held is not None and not connection_is_alive(
                self._held.connection.dbapi_connection):
            self._held.invalidate()
            self._release()
        if self._held is None:
            self._held = self.engine.connect()

    def _release(self) -> None:
        """Give the loop's own connection back (after storage trouble, a fresh one is taken)."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def _loop(self, *, burst: bool, stop: threading.Event, poll_seconds: float) -> int:
        """Run rounds until told to stop; work items already leased to us run first."""
        processed = errors = 0
        while not stop.is_set() or self.next_batch:
            try:
                self._hold_live_connection()
                worked = batch.process_batch(self)
                errors = 0
            except Exception as error:  # storage trouble: back off, the lease protects the job
                self._release()
                errors += 1
                if errors == 1 or errors % 20 == 0:  # an outage is one line, not a flood
                    log.warning("worker.error", worker_id=self.worker_id,
                                error=error_summary(error), consecutive=errors)
                if burst and errors >= (BURST_OUTAGE_LIMIT if is_storage_error(error)
                                        else BURST_ERROR_LIMIT):
                    raise
                stop.wait(_error_backoff(error, errors, poll_seconds))
                continue
            if worked:
                processed += int(worked)
            elif burst:
                break
            else:
                stop.wait(poll_seconds * (0.5 + random.random()))  # jitter: no lockstep polls
        return processed


def _error_backoff(error: BaseException, errors: int, poll_seconds: float) -> float:
    """Return the wait after `errors` consecutive loop errors.

    While the database is away a retry is one refused connect, so the worker
    tries again every ~0.5 s (jittered) and resumes within a second of the
    database's return; any other error backs off exponentially up to 30 s.
    """
    if is_storage_error(error):
        return STORAGE_RETRY_SECONDS * (0.5 + random.random())
    return min(MAX_IDLE_BACKOFF_SECONDS, poll_seconds * 2.0**errors)


@contextmanager
def _begun(conn: Connection) -> Iterator[Connection]:
    """Run the block in a transaction of `conn` (commit on success, roll back on error)."""
    with conn.begin():
        yield conn


def process_one(services: Services, worker_id: str, *, handlers: Registry | None = None,
                rng: RandomSource | None = None, hooks: WorkerHooks | None = None) -> bool:
    """Claim and run exactly one due work item; False when none is due."""
    worker = Worker(services, worker_id=worker_id, handlers=handlers, rng=rng, hooks=hooks)
    return worker.process_one()


def _engine_for(services: Services, concurrency: int) -> Engine:
    """Return an engine whose pool has a connection for every thread."""
    settings = services.settings
    if concurrency <= settings.pool_size or settings.database_url.startswith("sqlite"):
        return services.engine
    # Same execution options (the audit key) as the services' engine.
    return make_engine(settings.with_(pool_size=concurrency)).execution_options(
        **services.engine.get_execution_options())


def run_worker(services: Services, *, burst: bool = False, concurrency: int = 1,
               stop: threading.Event | None = None, worker_id: str | None = None,
               handlers: Registry | None = None, hooks: WorkerHooks | None = None,
               batch_size: int | None = None) -> int:
    """Run `concurrency` worker loops until `stop` is set; return the jobs processed.

    `batch_size` (default LEDGER_WORKER_BATCH) jobs are claimed and committed at once.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    stop = stop or threading.Event()
    base_id = worker_id or new_instance_id()
    registry = handlers if handlers is not None else load_registry(services.settings)
    engine = _engine_for(services, concurrency)
    delivery = new_delivery(services, engine)  # one pooled HTTP client for every loop
    workers = [Worker(services, worker_id=base_id if concurrency == 1 else f"{base_id}/{i}",
                      handlers=registry, hooks=hooks, engine=engine, batch_size=batch_size,
                      delivery=delivery)
               for i in range(concurrency)]
    log.info("worker.start", worker_id=base_id, concurrency=concurrency, burst=burst,
             batch=workers[0].batch_size, handlers=registry.types())
    try:
        if concurrency == 1:
            return workers[0].run(burst=burst, stop=stop)
        return _run_threads(workers, burst=burst, stop=stop)
    finally:
        delivery.close()
        if engine is not services.engine:
            engine.dispose()
        log.info("worker.stop", worker_id=base_id)


def _run_threads(workers: list[Worker], *, burst: bool, stop: threading.Event) -> int:
    """Run each worker loop in its own thread; join them while staying signal-responsive."""
    counts = [0] * len(workers)

    def loop(index: int) -> None:
        counts[index] = workers[index].run(burst=burst, stop=stop)

    threads = [threading.Thread(target=loop, args=(i,), name=f"ledger-worker-{i}", daemon=True)
               for i in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)
    return sum(counts)
