"""The worker's batch path (LEDGER_WORKER_BATCH > 1): several jobs per claim and per commit.

One batch is, like one attempt of the single path (ledger.worker.loop):

1. Claim up to N due jobs in one statement (`batch_store.claim_batch`): each
   gets its own fencing token, lease, counted attempt and attempt row,
   committed before any handler runs. A job whose last lease expired
   unfinished, or whose handler has a prepare step, is claimed alone.
2. `prepare(event)` of a job claimed alone, with no transaction open.
3. One transaction: lock every job of the batch whose token is still ours
   (`hold_batch`: from here no other worker can take them, even once their
   leases have expired), then run each handler inside a SAVEPOINT of its own,
   in key order (batches that touch the same per-scope rows lock them in the
   same order). A handler that raises rolls back only its savepoint, and its
   failed attempt is recorded (retry, backoff or `failed`, as on the single
   path) in the same transaction. Then one statement completes every job whose
   handler succeeded and, inside the loop, claims the next batch. Commit: the
   successful jobs' effects, completions and failures commit together.

The batch shares the single path's pieces: its Worker's claim request, scope
names and attempt start, the fenced handler run (ledger.worker.fence), and the
recording and reporting of each attempt's end (ledger.worker.outcome). Only the
statements differ: several jobs per claim and completion (ledger.worker.batch_store).

A database error (connection lost, server gone, lock or statement timeout)
spends no attempt: if only the handler's savepoint was hit, that job alone is
handed back; if the transaction is lost, every job of the batch is handed back
(outcome `interrupted`) before the next claim. A worker killed mid-batch
commits nothing of it: every job of the batch is due again when its lease ends,
and its next claim takes it alone (it may be the one that killed the worker).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from psycopg import errors as psycopg_errors
from psycopg import pq
from sqlalchemy import Connection

from ledger.db.driver import run_in
from ledger.errors import error_summary
from ledger.worker.batch_store import BatchRequest, claim_batch, complete_batch, hold_batch
from ledger.worker.conflict_bodies import keep_original_bodies
from ledger.worker.destinations import run_all
from ledger.worker.fence import apply_handler
from ledger.worker.handlers import Event, HandlerSpec
from ledger.worker.outcome import COMPLETE, FENCED, Outcome, hand_off, record_failed_attempt
from ledger.worker.retry import failure_summary
from ledger.worker.store import Claim, ClaimedJob

if TYPE_CHECKING:
    from ledger.worker.loop import Leased, Worker


@dataclass(slots=True, kw_only=True)
class Entry:
    """One job of a batch and what became of it."""

    job: ClaimedJob
    scope: str
    spec: HandlerSpec | None
    event: Event | None = None
    error: Exception | None = None  # raised before the transaction (payload, prepare)
    leave: bool = False  # no handler here, a live worker has one: hand it back
    result_ref: str | None = None
    ended: Outcome | None = None  # set inside the transaction; reported after its commit

    @property
    def key(self) -> tuple[int, str]:
        """Return the job's key."""
        return self.job.scope_id, self.job.event_id


def batch_request(worker: Worker) -> BatchRequest:
    """Return the worker's claim of its next batch, now."""
    return BatchRequest(claim=worker.claim_request(), size=worker.batch_size,
                        alone_types=worker.alone_types)


def claim(worker: Worker) -> list[Leased]:
    """Lease the next batch in a transaction of its own; [] when none is due."""
    request = batch_request(worker)
    with worker.claim_connection() as conn:
        return _leased(worker, conn, claim_batch(conn, request), request)


def _leased(worker: Worker, conn: Connection, claims: list[Claim], request: BatchRequest
            ) -> list[Leased]:
    """Return the claims with their scope names (those not cached read in one statement)."""
    worker.cache_scopes(conn, (one[0].scope_id for one in claims))
    found = (worker.leased(conn, one, request.claim) for one in claims)
    return [one for one in found if one is not None]


def process_batch(worker: Worker) -> int:
    """Claim and run the next batch; return how many jobs it held (0: none was due)."""
    if worker.interrupted:
        worker.record_interruptions()  # before any claim: those jobs are still ours
    leased = worker.next_batch or claim(worker)
    worker.next_batch = []
    if not leased:
        return 0
    entries = []
    for one in sorted(leased, key=lambda item: (item[0][0].scope_id, item[0][0].event_id)):
        started = worker.start_attempt(*one)
        if started is not None:
            job, scope = started
            entries.append(Entry(job=job, scope=scope, spec=worker.registry.get(job.event_type)))
    if entries:
        _route(worker, entries)
        worker.attempt_started = time.perf_counter()
        # Destinations' requests of the batch go out together (the only prepare steps a
        # batch can hold several of: a Python handler's prepare is claimed alone).
        sends = [e for e in entries if not e.leave and e.spec is not None and e.spec.prepare]
        for entry in entries:
            if not entry.leave and entry not in sends:
                _prepare(worker, entry)
        run_all([functools.partial(_prepare, worker, entry) for entry in sends])
        _run(worker, entries)
    return len(leased)


def _route(worker: Worker, entries: list[Entry]) -> None:
    """Give each job without a Python handler its destination's, or leave it to a live
    worker that has the handler (a rolling deploy)."""
    specs = worker.destination_specs([e.job for e in entries if e.spec is None])
    for entry in entries:
        if entry.spec is None:
            entry.spec = specs.get(entry.key)
            entry.leave = entry.spec is None and worker.handled_elsewhere(entry.job.event_type)


def _prepare(worker: Worker, entry: Entry) -> None:
    """Build the handler's event and run its prepare step (no transaction open)."""
    try:
        event = worker.event_of(entry.job, entry.scope)
        if entry.spec is not None and entry.spec.prepare is not None:
            event = replace(event, prepared=entry.spec.prepare(event))
        entry.event = event
    except Exception as error:  # the handler's failure, recorded in the transaction
        entry.error = error


def _run(worker: Worker, entries: list[Entry]) -> None:
    """Run the batch's transaction, then report every job's outcome."""
    try:
        worker.next_batch = _transaction(worker, entries)
    except Exception as error:
        if not worker.is_storage_error(error):
            raise
        summary = error_summary(error)  # the whole transaction is lost: nothing committed
        worker.interrupted = [(e.job, e.scope, summary) for e in entries
                              if e.ended is not FENCED]
        for entry in entries:
            if entry.ended is FENCED:
                worker.report(entry.job, entry.scope, FENCED)
        worker.record_interruptions()  # raises while the database is still away
        return
    for entry in entries:
        assert entry.ended is not None
        worker.report(entry.job, entry.scope, entry.ended, entry.event)


def _transaction(worker: Worker, entries: list[Entry]) -> list[Leased]:
    """Hold the batch, run its handlers (a savepoint each), complete it; return the next."""
    with worker.transaction() as conn:
        held = hold_batch(conn, [entry.job for entry in entries])
        for entry in entries:
            if entry.key not in held:
                entry.ended = FENCED  # taken over before the batch began: never run
                continue
            if entry.leave:
                entry.ended = hand_off(conn, entry.job, rng=worker.rng,
                                       now=worker.services.clock.now())
                continue
            if entry.error is None:
                _apply(worker, conn, entry)
            if entry.error is not None:
                entry.ended = _record(worker, conn, entry.job, entry.error)
        done = [(e.job, e.result_ref) for e in entries
                if e.ended is COMPLETE and e.result_ref is not None]
        chain = batch_request(worker) if worker.chaining() else None
        completion = complete_batch(conn, done,
                                    now=worker.services.clock.now(), then_claim=chain)
        if completion.completed != len(done):  # cannot happen while the hold holds
            raise RuntimeError("a held job of the batch was not completed")
        keep_original_bodies(conn, (job for job, _ in done), now=worker.services.clock.now(),
                             seconds=worker.services.settings.conflict_body_seconds)
        return [] if chain is None else _leased(worker, conn, completion.next, chain)


def _apply(worker: Worker, conn: Connection, entry: Entry) -> None:
    """Run one handler inside its own savepoint; a failure undoes only its writes."""
    assert entry.event is not None
    _on_driver(conn, SAVEPOINT)
    try:
        result_ref = apply_handler(entry.spec, conn, entry.event)
        if worker.hooks.before_commit is not None:
            worker.hooks.before_commit(conn, entry.event)
    except Exception as error:
        try:
            _on_driver(conn, ROLLBACK_TO_SAVEPOINT)
        except Exception as lost:  # the connection is gone: so is the whole batch
            raise (error if worker.is_storage_error(error) else lost) from None
        entry.error = error
        return
    entry.ended, entry.result_ref = COMPLETE, result_ref


# One savepoint name for every job, never released: each SAVEPOINT nests inside
# the previous job's, ROLLBACK TO goes back to the newest one (this job's start),
# and the commit ends them all. That is one round trip per job instead of two.
# Sent on the driver connection: SQLAlchemy's begin_nested() compiles its
# SAVEPOINT and RELEASE anew each time.
# The savepoint is invisible to SQLAlchemy, which only sees one transaction.
SAVEPOINT = "SAVEPOINT ledger_job"
ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT ledger_job"


def _on_driver(conn: Connection, statement: str) -> None:
    """Run a parameterless statement on the driver connection, inside conn's transaction."""
    run_in(conn, _execute, statement, what="worker savepoint")


def _execute(driver_connection: Any, statement: str) -> None:
    """Execute `statement` on a DB-API connection (psycopg or sqlite3).

    psycopg: as a simple query on libpq (`PGconn.exec_`, which releases the GIL),
    the way psycopg sends its own BEGIN and COMMIT, not through a cursor: no
    cursor, no parameter handling, no prepared-statement bookkeeping, one
    protocol message; 4 us of client CPU per savepoint instead of 13. Errors are raised as
    psycopg's.
    """
    pgconn = getattr(driver_connection, "pgconn", None)
    if pgconn is None:
        driver_connection.execute(statement)
        return
    result = pgconn.exec_(statement.encode())
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise psycopg_errors.error_from_result(result, encoding=driver_connection.info.encoding)


def _record(worker: Worker, conn: Connection, job: ClaimedJob, error: Exception) -> Outcome:
    """Record a failed (or, for a database error, interrupted) attempt in the transaction."""
    interrupted = worker.is_storage_error(error)
    return record_failed_attempt(conn, job, None if interrupted else error,
                                 failure_summary(error), policy=worker.policy, rng=worker.rng,
                                 now=worker.services.clock.now())
