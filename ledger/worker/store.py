"""Every SQL statement of the worker. Functions take `conn` and never commit.

One claim, one hold and one completion serve every worker, for N work items at
once (N = 1 is the single-item case: the same functions, and statements built from
the same templates without the steps one item does not need):
`claim_work` leases up to N due work items (rows of the `jobs` table), each with
its own fencing token, lease, counted attempt and attempt row; `hold_work` locks
the ones whose token is still ours before a failure or several handlers run;
`complete_work` ends every item whose handler succeeded, fenced by its token (a
worker whose lease was taken over finds its token gone and changes nothing),
and inside the worker's loop claims the next items in the same statement.

Hot statements are built once at import and run with a plain parameter dict
(building `update(...).values(...)` per call would cost most of the worker's CPU). On PostgreSQL
the claim, the hold and the completion are one statement each (data-modifying CTEs, in
ledger.worker.sql); SQLite runs the same steps as simple statements inside its
BEGIN IMMEDIATE, and a distributed (Citus) ledger as statements keyed by scope.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    bindparam,
    delete,
    insert,
    select,
    update,
)

from ledger.db import citus
from ledger.db.schema import UTCDateTime, attempts, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.worker.failure_groups import record_failure, remove_failure
from ledger.worker.sql import (
    CLAIM_ONE_SQL,
    CLAIM_SQL,
    DRIVER_COMPLETE,
    DRIVER_COMPLETE_AND_CLAIM,
    DRIVER_COMPLETE_ONE,
    DRIVER_HOLD,
)

ERROR_LIMIT = 500
LOST_ERROR = "WorkerLost: the lease expired before the attempt reported an outcome"


@dataclass(frozen=True, slots=True, kw_only=True)
class DueItem:
    """A claimable work item as the claim query found it (locked by the claim's transaction)."""

    scope_id: int
    event_id: str
    event_type: str
    window_start: datetime  # jobs.accepted_at: acceptance, or the operator's last requeue
    attempts: int  # attempts started since the window opened
    lease_token: int
    payload: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkItem:
    """A work item (a row of `jobs`) leased to one worker: the token fences every later write."""

    scope_id: int
    event_id: str
    event_type: str
    payload: str | None
    window_start: datetime
    accepted_at: datetime  # the receipt's acceptance: the event's age in logs
    attempt: int  # this attempt's place in the retry budget (1 = first since the window opened)
    number: int  # this attempt's number in the receipt's history (never reset)
    lease_token: int
    leased_until: datetime
    lost: int = 0  # earlier attempts this claim found abandoned (their worker vanished)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimLimits:
    """What the claim checks before it starts an attempt (RetryPolicy.refuse_to_start)."""

    max_attempts: int  # a job with this many attempts started in its window may not start
    oldest_window: datetime  # a window opened before this is too old (now - max event age)


# Bind names differ from column names: SQLAlchemy would read a parameter named like a
# column of the updated table as a value to SET.
def _job_key() -> tuple[Any, Any]:
    """Return the WHERE clause naming one job by :sid/:eid."""
    return (jobs.c.scope_id == bindparam("sid"), jobs.c.event_id == bindparam("eid"))


def _receipt_key() -> tuple[Any, Any]:
    """Return the WHERE clause naming one receipt by :sid/:eid."""
    return (receipts.c.scope_id == bindparam("sid"), receipts.c.event_id == bindparam("eid"))


def _attempt_key() -> tuple[Any, Any]:
    """Return the WHERE clause naming one receipt's attempts by :sid/:eid."""
    return (attempts.c.scope_id == bindparam("sid"), attempts.c.event_id == bindparam("eid"))


def due_job_query() -> Select[Any]:
    """Return the claim query: the oldest due job (run_at <= :now) that no other worker holds."""
    return (
        select(jobs.c.scope_id, jobs.c.event_id, jobs.c.event_type, jobs.c.accepted_at,
               jobs.c.attempts, jobs.c.lease_token, jobs.c.payload)
        # Queued only: failed jobs (status 1) wait for an operator. This is also
        # the predicate of the partial index ix_jobs_due, so the planner uses it.
        .where(jobs.c.status == JobStatus.QUEUED.value)
        # Due: new work, a retry whose backoff has passed, or a lease that expired
        # (a claim sets run_at to the lease's end, so no separate lease test).
        .where(jobs.c.run_at <= bindparam("now", type_=UTCDateTime))
        # Oldest first, in index order: fair, and no sort step.
        .order_by(jobs.c.run_at)
        # One job per claim: a worker never sits on work it cannot start.
        .limit(1)
        # FOR UPDATE: the row stays ours until the lease is written and committed.
        # SKIP LOCKED: other workers take the next row instead of queueing behind
        # ours. SQLite ignores both; its BEGIN IMMEDIATE already serialises claims.
        .with_for_update(skip_locked=True)
    )


_DUE = due_job_query()
# SQLite's pick: the claim query for up to :batch rows, with what tells whether a work
# item must run alone (see sql._CLAIM_CTES).
_DUE_BATCH = (_DUE.add_columns(jobs.c.leased_by)
              .limit(bindparam("batch", type_=Integer)))

# On a distributed (Citus) ledger a locking statement must name one scope: Citus
# refuses FOR UPDATE across shards. The claim there is two steps (claim_by_key):
# read the keys of the oldest due jobs, without a lock, which Citus sends to every
# shard as `ORDER BY run_at LIMIT n` on its ix_jobs_due (n rows per shard, however
# many scopes there are), then lock one of those jobs by its primary key, which goes
# to the one node holding its scope. A key another worker took in between is
# skipped (locked) or no longer due (leased): the next key is tried. The read costs
# a task per shard (32 by default), so a worker keeps the keys it read for its
# next claims, up to KEYS_MAX_AGE: a job that falls due meanwhile waits that long
# at most before a read sees it (README, "Scaling past one database").
CLAIM_CANDIDATES = 16
KEYS_MAX_AGE = 1.0  # seconds
_KEYS: dict[tuple[int, str], tuple[float, list[tuple[int, str]]]] = {}
_DUE_KEYS = (select(jobs.c.scope_id, jobs.c.event_id)
             .where(jobs.c.status == JobStatus.QUEUED.value,
                    jobs.c.run_at <= bindparam("now", type_=UTCDateTime))
             .order_by(jobs.c.run_at).limit(CLAIM_CANDIDATES))
_DUE_BY_KEY = _DUE.limit(None).order_by(None).where(*_job_key())
_COUNT = (update(receipts).where(*_receipt_key()).values(attempts=receipts.c.attempts + 1)
          .returning(receipts.c.attempts, receipts.c.accepted_at))
_LEASE = update(jobs).where(*_job_key()).values(
    attempts=jobs.c.attempts + 1, lease_token=bindparam("token"),
    leased_by=bindparam("worker_id"), leased_until=bindparam("lease_end", type_=UTCDateTime),
    run_at=bindparam("lease_end", type_=UTCDateTime))
_MARK_LOST = update(attempts).where(
    *_attempt_key(), attempts.c.finished_at.is_(None), attempts.c.number < bindparam("below"),
).values(finished_at=bindparam("now", type_=UTCDateTime), outcome="lost", error=LOST_ERROR)
_OPEN = insert(attempts)
_HOLD = (select(jobs.c.lease_token)
         .where(*_job_key(), jobs.c.lease_token == bindparam("token"),
                jobs.c.status == JobStatus.QUEUED.value)
         .with_for_update())
_RELOCK = _HOLD.where(jobs.c.attempts == bindparam("tries"))
_FINISH = update(attempts).where(
    *_attempt_key(), attempts.c.number == bindparam("num"),
    attempts.c.lease_token == bindparam("token"),
).values(finished_at=bindparam("now", type_=UTCDateTime), outcome=bindparam("how"),
         error=bindparam("err"))
_RECEIPT_DONE = update(receipts).where(*_receipt_key()).values(
    state=ReceiptState.COMPLETE.code, completed_at=bindparam("now", type_=UTCDateTime),
    result_ref=bindparam("ref"))
_RECEIPT_FAILED = update(receipts).where(*_receipt_key()).values(
    state=ReceiptState.FAILED.code, completed_at=bindparam("now", type_=UTCDateTime))
_FENCED_DELETE = delete(jobs).where(*_job_key(), jobs.c.lease_token == bindparam("token"),
                                     jobs.c.status == JobStatus.QUEUED.value)
_PARK = update(jobs).where(*_job_key()).values(
    status=JobStatus.FAILED.value, leased_by=None, leased_until=None)
_RETRY = update(jobs).where(*_job_key()).values(
    run_at=bindparam("due_at", type_=UTCDateTime), leased_by=None, leased_until=None)
_HAND_BACK = update(jobs).where(*_job_key()).values(
    attempts=jobs.c.attempts - 1, run_at=bindparam("due_at", type_=UTCDateTime),
    leased_by=None, leased_until=None)


def select_due_job(conn: Connection, now: datetime) -> DueItem | None:
    """Find and lock the oldest due job that no other worker holds."""
    row = conn.execute(_DUE, {"now": now}).first()
    return None if row is None else _due(row)


def _due(row: Any) -> DueItem:
    """Return the due job of a claim row."""
    return DueItem(scope_id=row.scope_id, event_id=row.event_id, event_type=row.event_type,
                  window_start=row.accepted_at, attempts=row.attempts,
                  lease_token=row.lease_token, payload=row.payload)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """Who claims up to `size` due work items, at what time, for how long, within which limits.

    Work items of `alone_types` (a handler with a prepare step), and any whose last
    lease expired unfinished, are claimed alone.
    """

    worker_id: str
    now: datetime
    lease_seconds: float
    limits: ClaimLimits
    size: int = 1
    alone_types: tuple[str, ...] = ()

    @property
    def leased_until(self) -> datetime:
        """Return the end of the lease this claim writes."""
        return self.now + timedelta(seconds=self.lease_seconds)

    def params(self) -> dict[str, Any]:
        """Return the claim statement's parameters."""
        return {"now": self.now, "leased_until": self.leased_until,
                "oldest_window": self.limits.oldest_window,
                "max_attempts": self.limits.max_attempts, "worker_id": self.worker_id,
                "batch": self.size, "alone_types": text_array(self.alone_types)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """What one claim of one work item gave: the item leased, or (item None) one to end.

    `item` is None when the work item may not start (see ClaimLimits) or has no
    receipt: nothing was counted or leased then, and the worker ends it (`due`).
    `scope` is the scope's name, filled in by the worker.
    """

    due: DueItem
    item: WorkItem | None
    claimed_at: datetime
    scope: str = ""

    @property
    def key(self) -> tuple[int, str]:
        """Return the work item's key."""
        return self.due.scope_id, self.due.event_id

    def named(self, scope: str) -> Lease:
        """Return the lease with its scope's name."""
        # Built directly: dataclasses.replace costs several times as much, once per item.
        return Lease(due=self.due, item=self.item, claimed_at=self.claimed_at, scope=scope)

    @classmethod
    def from_row(cls, conn: Connection, row: Any, request: ClaimRequest) -> Lease | None:
        """Return the lease a CLAIM_SQL or COMPLETE_AND_CLAIM_SQL row describes (None: none).

        A work item that had attempts in its window may have one whose worker
        vanished (its lease expired with no outcome): close it now, on the claim's
        connection (inside the completion's transaction for a chained claim). A
        worker that dies before this leaves it open; the next claim closes it.
        """
        if row is None or row.scope_id is None:
            return None
        due = _due(row)
        if row.number is None:
            return cls(due=due, item=None, claimed_at=request.now)
        lost = 0
        if due.attempts:
            lost = mark_lost_attempts(conn, due.scope_id, due.event_id, request.now,
                                      below=row.number)
        return cls(due=due, claimed_at=request.now,
                   item=_claimed(due, number=row.number, accepted_at=row.receipt_accepted_at,
                                 leased_until=request.leased_until, lost=lost))


# The statements take their per-item values as arrays (`CAST(:sids AS bigint[])`),
# each bound as ONE text parameter holding PostgreSQL's array literal: psycopg's list
# adapter inspects and dumps every element in Python, which costs a third of these
# statements' client CPU. Still bound
# parameters: PostgreSQL parses the literal as array input, never as SQL.
def int_array(values: Iterable[int]) -> str:
    """Return the array literal of integers, e.g. {1,2,3}."""
    return "{" + ",".join(str(int(value)) for value in values) + "}"


def text_array(values: Iterable[str]) -> str:
    """Return the array literal of strings, each quoted: {"a","b\\"c"}."""
    return "{" + ",".join('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for value in values) + "}"


def claim_work(conn: Connection, request: ClaimRequest) -> list[Lease]:
    """Lease up to `request.size` due work items, oldest first; [] when none is due.

    A work item that may not start comes back with `item` None (see Lease).
    """
    if conn.dialect.name == "postgresql":
        if citus.distributed(conn.engine):  # one item per claim, locked by its key
            lease = claim_by_key(conn, request)
            return [] if lease is None else [lease]
        statement = CLAIM_ONE_SQL if request.size == 1 else CLAIM_SQL
        return _leases(conn, conn.execute(statement, request.params()).all(), request)
    rows = conn.execute(_DUE_BATCH, {"now": request.now, "batch": request.size}).all()
    leases: list[Lease] = []
    for place, row in enumerate(rows):  # SQLite: plainly oldest first (one writer)
        alone = row.leased_by is not None or row.event_type in request.alone_types
        if place > 0 and alone:
            continue  # it comes alone in a later claim
        lease = _lease_due(conn, _due(row), request)
        if lease is not None:
            leases.append(lease)
        if place == 0 and alone:
            break
    return leases


def _leases(conn: Connection, rows: Sequence[Any], request: ClaimRequest) -> list[Lease]:
    """Return the leases of a claim's rows (lost attempts closed on the way)."""
    found = (Lease.from_row(conn, row, request) for row in rows)
    return [lease for lease in found if lease is not None]


def claim_by_key(conn: Connection, request: ClaimRequest) -> Lease | None:
    """Claim on a distributed ledger: one of the oldest due work items, locked by its key.

    Runs inside the caller's transaction (several statements), each locking or
    writing statement on the item's scope alone, so it commits on one node.
    """
    mine = (id(conn.engine.pool), request.worker_id)
    read_at, keys = _KEYS.pop(mine, (0.0, []))
    fresh = time.monotonic() - read_at > KEYS_MAX_AGE or not keys
    for _ in range(2):  # the kept keys, then (if none was claimable) a fresh read
        if fresh:
            read_at = time.monotonic()
            keys = [(int(s), str(e)) for s, e in conn.execute(_DUE_KEYS, {"now": request.now})]
        while keys:
            scope_id, event_id = keys.pop(0)
            row = conn.execute(_DUE_BY_KEY, {"now": request.now, "sid": scope_id,
                                             "eid": event_id}).first()
            if row is not None:
                _KEYS[mine] = (read_at, keys)
                return _lease_due(conn, _due(row), request)
        if fresh:
            return None
        fresh = True
    return None


def _lease_due(conn: Connection, due: DueItem, request: ClaimRequest) -> Lease | None:
    """Lease a locked due work item unless it may not start (then item None)."""
    limits = request.limits
    if due.attempts >= limits.max_attempts or due.window_start < limits.oldest_window:
        return Lease(due=due, item=None, claimed_at=request.now)
    return Lease(due=due, claimed_at=request.now,
                 item=lease_job(conn, due, worker_id=request.worker_id, now=request.now,
                                lease_seconds=request.lease_seconds))


def _claimed(due: DueItem, *, number: int, accepted_at: datetime, leased_until: datetime,
             lost: int) -> WorkItem:
    """Return the leased job: the token is the one the claim wrote (the old one + 1)."""
    return WorkItem(
        scope_id=due.scope_id, event_id=due.event_id, event_type=due.event_type,
        payload=due.payload, window_start=due.window_start, accepted_at=accepted_at,
        attempt=due.attempts + 1, number=number, lease_token=due.lease_token + 1,
        leased_until=leased_until, lost=lost)


def lease_job(conn: Connection, due: DueItem, *, worker_id: str, now: datetime,
              lease_seconds: float) -> WorkItem | None:
    """Lease the job with a new fencing token and open its attempt row.

    The attempt is counted here, before the handler runs, so a job that keeps
    killing its workers still runs out of attempts. None if the receipt is gone.
    """
    key = {"sid": due.scope_id, "eid": due.event_id}
    counted = conn.execute(_COUNT, key).first()
    if counted is None:
        return None
    lost = 0
    if due.attempts:
        lost = mark_lost_attempts(conn, due.scope_id, due.event_id, now, below=counted.attempts)
    job = _claimed(due, number=counted.attempts, accepted_at=counted.accepted_at,
                   leased_until=now + timedelta(seconds=lease_seconds), lost=lost)
    conn.execute(_LEASE, {**key, "token": job.lease_token, "worker_id": worker_id,
                          "lease_end": job.leased_until})
    conn.execute(_OPEN, {"scope_id": due.scope_id, "event_id": due.event_id,
                         "number": job.number, "worker_id": worker_id,
                         "lease_token": job.lease_token, "started_at": now})
    return job


def mark_lost_attempts(conn: Connection, scope_id: int, event_id: str, now: datetime, *,
                       below: int) -> int:
    """Close attempts numbered below `below` whose worker vanished (lease expired, no
    outcome); return how many."""
    return conn.execute(_MARK_LOST, {"sid": scope_id, "eid": event_id, "now": now,
                                     "below": below}).rowcount


def set_job_failed(conn: Connection, scope_id: int, event_id: str) -> None:
    """Park a job for review: status failed, payload kept."""
    conn.execute(_PARK, {"sid": scope_id, "eid": event_id})


def fail_unstarted(conn: Connection, due: DueItem, *, worker_id: str, reason: str,
                   now: datetime) -> int | None:
    """Make the receipt failed without running the attempt; return the receipt's attempts."""
    started = conn.execute(
        update(receipts).where(receipts.c.scope_id == due.scope_id,
                               receipts.c.event_id == due.event_id)
        .values(state=ReceiptState.FAILED.code, completed_at=now)
        .returning(receipts.c.attempts)
    ).scalar()
    set_job_failed(conn, due.scope_id, due.event_id)
    if started is None:
        return None
    if due.attempts > 0:
        mark_lost_attempts(conn, due.scope_id, due.event_id, now, below=int(started) + 1)
    # A "not-run" row carries the reason, so `receipt show` explains the failure.
    conn.execute(insert(attempts).values(
        scope_id=due.scope_id, event_id=due.event_id, number=int(started) + 1,
        worker_id=worker_id, lease_token=due.lease_token, started_at=now, finished_at=now,
        outcome="not-run", error=reason[:ERROR_LIMIT]))
    record_failure(conn, scope_id=due.scope_id, event_id=due.event_id,
                   event_type=due.event_type, error=reason[:ERROR_LIMIT], failed_at=now)
    return int(started)


def relock_due(conn: Connection, due: DueItem) -> bool:
    """Lock a job found by an earlier claim if no worker changed it since (before ending it)."""
    key = {"sid": due.scope_id, "eid": due.event_id, "token": due.lease_token,
           "tries": due.attempts}
    return conn.execute(_RELOCK, key).first() is not None


def hold_lease(conn: Connection, job: WorkItem) -> bool:
    """Lock the job if our fencing token is still current (the first statement of a write).

    PostgreSQL: FOR UPDATE makes a concurrent claim skip the row until we commit,
    and waits out a claim in flight, then re-reads the token. SQLite: the
    transaction's BEGIN IMMEDIATE write lock already excludes every other writer.
    """
    key = {"sid": job.scope_id, "eid": job.event_id, "token": job.lease_token}
    return conn.execute(_HOLD, key).first() is not None


def finish_attempt(conn: Connection, job: WorkItem, *, outcome: str, now: datetime,
                   error: str | None = None) -> None:
    """Record how this attempt ended."""
    conn.execute(_FINISH, {
        "sid": job.scope_id, "eid": job.event_id, "num": job.number,
        "token": job.lease_token, "now": now, "how": outcome,
        "err": error[:ERROR_LIMIT] if error is not None else None})


def hold_work(conn: Connection, items: Sequence[WorkItem]) -> set[tuple[int, str]]:
    """Lock the work items whose token is still ours; return their keys.

    Until the transaction ends no claim can take them, expired lease or not.
    PostgreSQL: one statement (HOLD_SQL), in key order. SQLite: BEGIN IMMEDIATE
    already excludes every other writer, and a distributed ledger locks by key:
    the tokens are checked one by one.
    """
    if conn.dialect.name == "postgresql" and not citus.distributed(conn.engine):
        rows = DRIVER_HOLD.rows(conn, {
            "sids": int_array(item.scope_id for item in items),
            "eids": text_array(item.event_id for item in items),
            "tokens": int_array(item.lease_token for item in items)})
        return {(int(row.scope_id), str(row.event_id)) for row in rows}
    return {(item.scope_id, item.event_id) for item in items if hold_lease(conn, item)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What complete_work did: how many work items it ended, and the next leases if asked."""

    completed: int
    next: list[Lease]


def complete_work(conn: Connection, done: Sequence[tuple[WorkItem, str]], *, now: datetime,
                  then_claim: ClaimRequest | None = None) -> Completion:
    """End every (work item, result_ref) of `done` whose token is still ours.

    Its receipt becomes complete with the result_ref, its attempt closes and the
    item (with its payload) is gone. An item whose lease was taken over is left
    as it is: `completed` < len(done) tells the caller to roll back. With
    `then_claim`, the next work items are claimed in the same transaction (on a
    distributed ledger they are likely on another node, and one transaction
    writing on two nodes commits in two phases: the caller claims them apart).
    """
    if conn.dialect.name == "postgresql" and not citus.distributed(conn.engine):
        one = len(done) == 1
        if one:
            item, ref = done[0]
            params: dict[str, Any] = {
                "sid": item.scope_id, "eid": item.event_id, "token": item.lease_token,
                "number": item.number, "ref": ref}
        else:
            params = {
                "sids": int_array(item.scope_id for item, _ in done),
                "eids": text_array(item.event_id for item, _ in done),
                "tokens": int_array(item.lease_token for item, _ in done),
                "numbers": int_array(item.number for item, _ in done),
                "refs": text_array(ref for _, ref in done)}
        params["now"], params["complete"] = now, ReceiptState.COMPLETE.code
        if then_claim is None:
            statement = DRIVER_COMPLETE_ONE if one else DRIVER_COMPLETE
            return Completion(completed=int(statement.row(conn, params).held), next=[])
        chained = DRIVER_COMPLETE_AND_CLAIM[one, then_claim.size == 1]
        rows = chained.rows(conn, {**then_claim.params(), **params})
        return Completion(completed=int(rows[0].held), next=_leases(conn, rows, then_claim))
    completed = 0
    for item, result_ref in done:
        key = {"sid": item.scope_id, "eid": item.event_id}
        if conn.execute(_FENCED_DELETE, {**key, "token": item.lease_token}).rowcount != 1:
            continue
        conn.execute(_RECEIPT_DONE, {**key, "now": now, "ref": result_ref})
        finish_attempt(conn, item, outcome="complete", now=now)
        completed += 1
    if then_claim is None or citus.distributed(conn.engine):
        return Completion(completed=completed, next=[])
    return Completion(completed=completed, next=claim_work(conn, then_claim))


def schedule_retry(conn: Connection, job: WorkItem, *, run_at: datetime) -> None:
    """Release the lease and make the job due again at `run_at`."""
    conn.execute(_RETRY, {"sid": job.scope_id, "eid": job.event_id, "due_at": run_at})


def hand_back_attempt(conn: Connection, job: WorkItem, *, run_at: datetime) -> None:
    """Release the lease, return the attempt to the retry budget, make the job due at `run_at`.

    For an attempt the database cut off: the receipt keeps counting it (its
    history), the budget of LEDGER_MAX_ATTEMPTS does not.
    """
    conn.execute(_HAND_BACK, {"sid": job.scope_id, "eid": job.event_id, "due_at": run_at})


_UNOPEN = delete(attempts).where(*_attempt_key(), attempts.c.number == bindparam("num"),
                                 attempts.c.lease_token == bindparam("token"))
_UNCOUNT = update(receipts).where(*_receipt_key()).values(attempts=receipts.c.attempts - 1)
_OUTCOME = select(attempts.c.outcome).where(*_attempt_key(),
                                            attempts.c.number == bindparam("num"))


def previous_outcome(conn: Connection, job: WorkItem) -> str | None:
    """Return how the receipt's attempt before this one ended (None: none, or still open)."""
    return conn.execute(_OUTCOME, {"sid": job.scope_id, "eid": job.event_id,
                                   "num": job.number - 1}).scalar()


def unstart_attempt(conn: Connection, job: WorkItem, *, run_at: datetime) -> None:
    """Undo a claim whose attempt never started (a destination held it back): no attempt
    spent or shown, the job due again at `run_at`."""
    key = {"sid": job.scope_id, "eid": job.event_id}
    conn.execute(_UNOPEN, {**key, "num": job.number, "token": job.lease_token})
    conn.execute(_UNCOUNT, key)
    hand_back_attempt(conn, job, run_at=run_at)


def fail_job(conn: Connection, job: WorkItem, *, now: datetime, error: str | None,
             group_type: str | None = None) -> None:
    """Make the receipt failed (terminal, reviewable) and count it into its failure group
    (of its event type, or `group_type`: a destination's); the job keeps its payload."""
    conn.execute(_RECEIPT_FAILED, {"sid": job.scope_id, "eid": job.event_id, "now": now})
    set_job_failed(conn, job.scope_id, job.event_id)
    record_failure(conn, scope_id=job.scope_id, event_id=job.event_id,
                   event_type=group_type or job.event_type,
                   error=error[:ERROR_LIMIT] if error else None,
                   failed_at=now)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedJob:
    """A failed job as an operator sees it before a requeue."""

    payload: str | None
    status: int
    window_start: datetime  # the retention purge drops a failed payload a review window later


def lock_job(conn: Connection, scope_id: int, event_id: str) -> ParkedJob | None:
    """Lock one job row for an operator action; None if it no longer exists."""
    row = conn.execute(
        select(jobs.c.payload, jobs.c.status, jobs.c.accepted_at)
        .where(jobs.c.scope_id == scope_id, jobs.c.event_id == event_id).with_for_update()
    ).first()
    if row is None:
        return None
    return ParkedJob(payload=row.payload, status=row.status, window_start=row.accepted_at)


def requeue_job(conn: Connection, scope_id: int, event_id: str, now: datetime) -> None:
    """Queue a failed job again, due now, with a fresh retry window (history is kept)."""
    conn.execute(
        update(jobs).where(jobs.c.scope_id == scope_id, jobs.c.event_id == event_id)
        .values(status=JobStatus.QUEUED.value, run_at=now, accepted_at=now, attempts=0,
                leased_by=None, leased_until=None)
    )
    conn.execute(
        update(receipts).where(receipts.c.scope_id == scope_id, receipts.c.event_id == event_id)
        .values(state=ReceiptState.PENDING.code, completed_at=None)
    )
    remove_failure(conn, scope_id, event_id)  # a requeued receipt leaves its failure group
