"""The worker's one path: claim N work items, run their handlers, commit their outcomes.

N is LEDGER_WORKER_BATCH (one on a distributed ledger); `Worker.process_one` runs
the same code with N = 1. One round is three short steps, and none holds a
transaction across slow work:

1. Claim up to N due work items in one statement (`store.claim_work`): each
   gets its own fencing token, lease, counted attempt and attempt row,
   committed before any handler runs (on PostgreSQL in autocommit). A work item
   whose last lease expired unfinished, or whose handler has a prepare step,
   is claimed alone. Inside `Worker.run` the previous round's completion made
   this claim (3 below): under a backlog a round costs one commit.
2. `prepare(event)` of each item's handler that declares one, with no
   transaction open: network calls and sleeps belong here (a destination's
   HTTP requests go out together).
3. One transaction runs the handlers on their fenced connection
   (ledger.worker.fence), in key order (rounds that touch the same per-scope
   rows lock them in the same order), then one statement completes every item
   whose handler succeeded (`store.complete_work`: the fence, an item goes only
   while our token is still its token) and, inside the loop, claims the next
   round. Commit: the handlers' effects, completions and failures commit
   together.

   Several items: the transaction first locks every item still ours
   (`store.hold_work`: from there no other worker can take them, even once
   their leases have expired), and each handler runs inside a SAVEPOINT of its
   own: one that raises rolls back only its savepoint, and its failed attempt
   is recorded (retry, backoff or `failed`) in the same transaction.

   One item (N = 1, or a round that found one): the transaction is its
   savepoint and the completion's fence its hold, as it costs no round trip
   of its own: a handler that raises, or a lease taken over meanwhile, rolls
   the transaction back (the handler's writes with it), and a failure is then
   recorded in a transaction that holds the item first. A stale worker's
   handler may run, but never commits.

A handler's failure follows the retry policy (PermanentFailure, RetryAfter;
ledger.worker.outcome). A database error (connection lost, server gone, lock or
statement timeout) spends no attempt: if only one handler's savepoint was hit,
that item alone is handed back; if the transaction is lost, every item of the
round is handed back (outcome `interrupted`) before the next claim. A worker
killed mid-round commits nothing of it: every item is due again when its lease
ends, and its next claim takes it alone (it may be the one that killed the
worker). An item whose type has no handler here while a live worker has one (a
rolling deploy) is handed back without spending an attempt; a destination that
does not admit its request holds it back the same way.
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
from ledger.worker.conflict_bodies import keep_original_bodies
from ledger.worker.destinations import run_all
from ledger.worker.fence import apply_handler
from ledger.worker.handlers import Event, HandlerSpec
from ledger.worker.outcome import COMPLETE, FENCED, Outcome, hand_off, record_failed_attempt
from ledger.worker.retry import failure_summary
from ledger.worker.store import Lease, WorkItem, claim_work, complete_work, hold_work

if TYPE_CHECKING:
    from ledger.worker.loop import Worker


@dataclass(slots=True, kw_only=True)
class Entry:
    """One work item of a round and what became of it."""

    item: WorkItem
    scope: str
    spec: HandlerSpec | None
    event: Event | None = None
    error: Exception | None = None  # raised before the transaction (payload, prepare)
    leave: bool = False  # no handler here, a live worker has one: hand it back
    forwarded: bool = False  # run by a destination (its metrics label says so)
    result_ref: str | None = None
    ended: Outcome | None = None  # set inside the transaction; reported after its commit

    @property
    def key(self) -> tuple[int, str]:
        """Return the work item's key."""
        return self.item.scope_id, self.item.event_id

    @property
    def runs(self) -> bool:
        """Tell whether its handler runs in the transaction (else a failure or hand-back)."""
        return self.error is None and not self.leave


class _Undone(Exception):
    """Internal: a lone item's handler raised or its lease was lost; roll back."""


def claim(worker: Worker, size: int | None = None) -> list[Lease]:
    """Lease the next round in a transaction of its own; [] when none is due."""
    request = worker.claim_request(size)
    with worker.claim_connection() as conn:
        return worker.named(conn, claim_work(conn, request))


def process_batch(worker: Worker, size: int | None = None) -> int:
    """Claim and run the next round of up to `size` (default the worker's batch) work items.

    Return how many it held (0: none was due). A round the last completion
    claimed runs first, whatever its size.
    """
    if worker.interrupted:
        worker.record_interruptions()  # before any claim: those items are still ours
    leased = worker.next_batch or claim(worker, size)
    worker.next_batch = []
    if not leased:
        return 0
    entries = []
    for lease in (sorted(leased, key=lambda one: one.key) if len(leased) > 1 else leased):
        item = worker.start_attempt(lease)
        if item is not None:
            entries.append(Entry(item=item, scope=lease.scope,
                                 spec=worker.registry.get(item.event_type)))
    if entries:
        if any(entry.spec is None for entry in entries):
            _route(worker, entries)
        worker.attempt_started = time.perf_counter()
        # Destinations' requests of the round go out together (the only prepare steps a
        # round can hold several of: a Python handler's prepare is claimed alone).
        sends = [e for e in entries if not e.leave and e.spec is not None and e.spec.prepare]
        for entry in entries:
            if not entry.leave and entry not in sends:
                _prepare(worker, entry)
        sends = _admitted(worker, sends)
        run_all([functools.partial(_prepare, worker, entry) for entry in sends], worker.sends)
        _run(worker, entries)
    return len(leased)


def _route(worker: Worker, entries: list[Entry]) -> None:
    """Give each work item without a Python handler its destination's, or leave it to a
    live worker that has the handler (a rolling deploy)."""
    specs = worker.destination_specs([e.item for e in entries if e.spec is None])
    for entry in entries:
        if entry.spec is None:
            entry.spec = specs.get(entry.key)
            entry.forwarded = entry.spec is not None
            entry.leave = entry.spec is None and worker.handled_elsewhere(entry.item.event_type)


def _admitted(worker: Worker, sends: list[Entry]) -> list[Entry]:
    """Build the events of a round's sends and admit its forwarded ones together; return
    the entries left to prepare (one whose event cannot be built has its error)."""
    if len(sends) < 2:
        return sends
    ready = []
    for entry in sends:
        try:
            entry.event = worker.event_of(entry.item, entry.scope)
        except Exception as error:  # recorded in the transaction, as _prepare records it
            entry.error = error
            continue
        ready.append(entry)
    forwarded = [(e.item, e.event) for e in ready if e.forwarded and e.event is not None]
    if len(forwarded) > 1:
        worker.admit_round(forwarded)
    return ready


def _prepare(worker: Worker, entry: Entry) -> None:
    """Build the handler's event and run its prepare step (no transaction open)."""
    try:
        event = entry.event or worker.event_of(entry.item, entry.scope)
        if entry.spec is not None and entry.spec.prepare is not None:
            event = replace(event, prepared=entry.spec.prepare(event))
        entry.event = event
    except Exception as error:  # the handler's failure, recorded in the transaction
        entry.error = error


def _run(worker: Worker, entries: list[Entry]) -> None:
    """Run the round's transaction, then report every work item's outcome."""
    try:
        try:
            worker.next_batch = _transaction(worker, entries)
        except _Undone:  # rolled back: record the lone item's failure, if it is one
            if any(entry.ended is None for entry in entries):
                worker.next_batch = _transaction(worker, entries)
    except Exception as error:
        if not worker.is_storage_error(error):
            raise
        summary = error_summary(error)  # the whole transaction is lost: nothing committed
        worker.interrupted = [(e.item, e.scope, summary) for e in entries
                              if e.ended is not FENCED]
        for entry in entries:
            if entry.ended is FENCED:
                worker.report(entry.item, entry.scope, FENCED, forwarded=entry.forwarded)
        worker.record_interruptions()  # raises while the database is still away
        return
    for entry in entries:
        assert entry.ended is not None
        worker.report(entry.item, entry.scope, entry.ended, entry.event,
                      forwarded=entry.forwarded)


def _transaction(worker: Worker, entries: list[Entry]) -> list[Lease]:
    """Hold the round, run its handlers, complete it; return the next round's leases."""
    alone = len(entries) == 1
    with worker.transaction() as conn:
        # A lone handler's hold is its completion's fence; anything else is held first.
        held = ({entries[0].key} if alone and entries[0].runs
                else hold_work(conn, [entry.item for entry in entries]))
        for entry in entries:
            if entry.key not in held:
                entry.ended = FENCED  # taken over before the round began: never run
                continue
            if entry.leave:
                entry.ended = hand_off(conn, entry.item, rng=worker.rng,
                                       now=worker.services.clock.now())
                continue
            if entry.error is None:
                _apply(worker, conn, entry, alone=alone)
            if entry.error is not None:
                entry.ended = _record(worker, conn, entry.item, entry.error)
        done = [(e.item, e.result_ref) for e in entries
                if e.ended is COMPLETE and e.result_ref is not None]
        chain = worker.claim_request() if worker.chaining() else None
        completion = complete_work(conn, done, now=worker.services.clock.now(),
                                   then_claim=chain)
        if completion.completed != len(done):
            if not alone:  # cannot happen while the hold holds
                raise RuntimeError("a held work item of the round was not completed")
            entries[0].ended = FENCED  # taken over meanwhile: its writes roll back
            raise _Undone()
        keep_original_bodies(conn, (item for item, _ in done), now=worker.services.clock.now(),
                             seconds=worker.services.settings.conflict_body_seconds)
        if worker.hooks.before_commit is not None:
            for entry in entries:
                if entry.ended is COMPLETE and entry.event is not None:
                    worker.hooks.before_commit(conn, entry.event)
        return worker.named(conn, completion.next)


def _apply(worker: Worker, conn: Connection, entry: Entry, *, alone: bool) -> None:
    """Run one handler inside its own savepoint (alone: its transaction); a failure undoes
    only its writes."""
    assert entry.event is not None
    if not alone:
        _on_driver(conn, SAVEPOINT)
    try:
        result_ref = apply_handler(entry.spec, conn, entry.event)
    except Exception as error:
        if alone:
            if worker.is_storage_error(error):
                raise  # the transaction is lost: handed back
            entry.error = error
            raise _Undone() from None  # its transaction rolls back; recorded in the next
        try:
            _on_driver(conn, ROLLBACK_TO_SAVEPOINT)
        except Exception as lost:  # the connection is gone: so is the whole round
            raise (error if worker.is_storage_error(error) else lost) from None
        entry.error = error
        return
    entry.ended, entry.result_ref = COMPLETE, result_ref


# One savepoint name for every work item, never released: each SAVEPOINT nests inside
# the previous item's, ROLLBACK TO goes back to the newest one (this item's start),
# and the commit ends them all. That is one round trip per item instead of two.
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


def _record(worker: Worker, conn: Connection, item: WorkItem, error: Exception) -> Outcome:
    """Record a failed (or, for a database error, interrupted) attempt in the transaction."""
    interrupted = worker.is_storage_error(error)
    return record_failed_attempt(conn, item, None if interrupted else error,
                                 failure_summary(error), policy=worker.policy, rng=worker.rng,
                                 now=worker.services.clock.now())
