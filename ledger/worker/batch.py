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

A database error (connection lost, server gone, lock or statement timeout)
spends no attempt: if only the handler's savepoint was hit, that job alone is
handed back; if the transaction is lost, every job of the batch is handed back
(outcome `interrupted`) before the next claim. A worker killed mid-batch
commits nothing of it: every job of the batch is due again when its lease ends,
and its next claim takes it alone (it may be the one that killed the worker).
"""

from __future__ import annotations

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
from ledger.worker.handlers import NO_HANDLER_RESULT, Event, HandlerSpec
from ledger.worker.store import (
    Claim,
    ClaimedJob,
    fail_job,
    finish_attempt,
    hand_back_attempt,
    schedule_retry,
)

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
    outcome: str = "pending"  # complete, retry, failed, interrupted, fenced
    result_ref: str | None = None
    summary: str | None = None
    reason: str | None = None
    retry_in: float | None = None

    @property
    def key(self) -> tuple[int, str]:
        """Return the job's key."""
        return self.job.scope_id, self.job.event_id


def batch_request(worker: Worker) -> BatchRequest:
    """Return the worker's claim of its next batch, now."""
    return BatchRequest(claim=worker._request(), size=worker.batch_size,
                        alone_types=worker.alone_types)


def claim(worker: Worker) -> list[Leased]:
    """Lease the next batch in a transaction of its own; [] when none is due."""
    request = batch_request(worker)
    with worker._claim_connection() as conn:
        return _leased(worker, conn, claim_batch(conn, request), request)


def _leased(worker: Worker, conn: Connection, claims: list[Claim], request: BatchRequest
            ) -> list[Leased]:
    """Return the claims with their scope names (those not cached read in one statement)."""
    worker._cache_scopes(conn, (one[0].scope_id for one in claims))
    found = (worker._leased(conn, one, request.claim) for one in claims)
    return [one for one in found if one is not None]


def process_batch(worker: Worker) -> int:
    """Claim and run the next batch; return how many jobs it held (0: none was due)."""
    if worker._interrupted:
        worker._record_interruptions()  # before any claim: those jobs are still ours
    leased = worker._next_batch or claim(worker)
    worker._next_batch = []
    if not leased:
        return 0
    entries = []
    for one in sorted(leased, key=lambda item: (item[0][0].scope_id, item[0][0].event_id)):
        started = worker._start(*one)
        if started is not None:
            job, scope = started
            entries.append(Entry(job=job, scope=scope, spec=worker.registry.get(job.event_type)))
    if entries:
        worker._attempt_started = time.perf_counter()
        for entry in entries:
            _prepare(worker, entry)
        _run(worker, entries)
    return len(leased)


def _prepare(worker: Worker, entry: Entry) -> None:
    """Build the handler's event and run its prepare step (no transaction open)."""
    try:
        event = worker._event(entry.job, entry.scope)
        if entry.spec is not None and entry.spec.prepare is not None:
            event = replace(event, prepared=entry.spec.prepare(event))
        entry.event = event
    except Exception as error:  # the handler's failure, recorded in the transaction
        entry.error = error


def _run(worker: Worker, entries: list[Entry]) -> None:
    """Run the batch's transaction, then report every job's outcome."""
    try:
        worker._next_batch = _transaction(worker, entries)
    except Exception as error:
        if not worker.is_storage_error(error):
            raise
        summary = error_summary(error)  # the whole transaction is lost: nothing committed
        worker._interrupted = [(e.job, e.scope, summary) for e in entries
                               if e.outcome != "fenced"]
        for entry in entries:
            if entry.outcome == "fenced":
                worker._transition(entry.job, entry.scope, "running", "fenced",
                                   outcome="fenced")
        worker._record_interruptions()  # raises while the database is still away
        return
    for entry in entries:
        _report(worker, entry)


def _transaction(worker: Worker, entries: list[Entry]) -> list[Leased]:
    """Hold the batch, run its handlers (a savepoint each), complete it; return the next."""
    with worker._transaction() as conn:
        held = hold_batch(conn, [entry.job for entry in entries])
        for entry in entries:
            if entry.key not in held:
                entry.outcome = "fenced"  # taken over before the batch began: never run
                continue
            if entry.error is None:
                _apply(worker, conn, entry)
            if entry.error is not None:
                _record(worker, conn, entry)
        done = [(e.job, e.result_ref) for e in entries
                if e.outcome == "complete" and e.result_ref is not None]
        stopping = worker._stop is None or worker._stop.is_set()
        chain = None if stopping else batch_request(worker)
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
        result_ref = (entry.spec.apply(conn, entry.event) if entry.spec is not None
                      else NO_HANDLER_RESULT)
        worker._check_result(entry.job, result_ref)
        if worker.hooks.before_commit is not None:
            worker.hooks.before_commit(conn, entry.event)
    except Exception as error:
        try:
            _on_driver(conn, ROLLBACK_TO_SAVEPOINT)
        except Exception as lost:  # the connection is gone: so is the whole batch
            raise (error if worker.is_storage_error(error) else lost) from None
        entry.error = error
        return
    entry.outcome, entry.result_ref = "complete", result_ref


# One savepoint name for every job, never released: each SAVEPOINT nests inside
# the previous job's, ROLLBACK TO goes back to the newest one (this job's start),
# and the commit ends them all. That is one round trip per job instead of two.
# Sent on the driver connection: SQLAlchemy's begin_nested() compiles its
# SAVEPOINT and RELEASE anew each time (measured: bench/README.md, "Workers").
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
    protocol message; 4 us of client CPU per savepoint instead of 13
    (bench/README.md, "Workers", fifth round). Errors are raised as psycopg's.
    """
    pgconn = getattr(driver_connection, "pgconn", None)
    if pgconn is None:
        driver_connection.execute(statement)
        return
    result = pgconn.exec_(statement.encode())
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise psycopg_errors.error_from_result(result, encoding=driver_connection.info.encoding)


def _record(worker: Worker, conn: Connection, entry: Entry) -> None:
    """Record a failed (or, for a database error, interrupted) attempt in the transaction."""
    assert entry.error is not None
    job, now = entry.job, worker.services.clock.now()
    entry.summary = error_summary(entry.error)
    interrupted = worker.is_storage_error(entry.error)
    decide = worker.policy.after_interruption if interrupted else worker.policy.after_failure
    decision = decide(job.number if interrupted else job.attempt, now=now,
                      window_start=job.window_start, rng=worker.rng)
    if decision.run_at is None:
        finish_attempt(conn, job, outcome="failed", now=now, error=entry.summary)
        fail_job(conn, job, now=now, error=entry.summary)
        entry.outcome, entry.reason = "failed", decision.reason
        return
    outcome = "interrupted" if interrupted else "retry"
    finish_attempt(conn, job, outcome=outcome, now=now, error=entry.summary)
    if interrupted:
        hand_back_attempt(conn, job, run_at=decision.run_at)
    else:
        schedule_retry(conn, job, run_at=decision.run_at)
    entry.outcome = outcome
    entry.retry_in = round((decision.run_at - now).total_seconds(), 3)


def _report(worker: Worker, entry: Entry) -> None:
    """Log and count one job's committed outcome (and call the after_commit hook)."""
    job, scope = entry.job, entry.scope
    if entry.outcome == "complete":
        worker._transition(job, scope, "running", "complete", outcome="complete")
        if worker.hooks.after_commit is not None and entry.event is not None:
            worker.hooks.after_commit(entry.event)
    elif entry.outcome == "failed":
        worker._transition(job, scope, "running", "failed", outcome="failed",
                           error=entry.summary, reason=entry.reason)
    elif entry.outcome in ("retry", "interrupted"):
        worker._transition(job, scope, "running", "retrying", outcome=entry.outcome,
                           error=entry.summary, retry_in_seconds=entry.retry_in)
    else:
        worker._transition(job, scope, "running", "fenced", outcome="fenced")
