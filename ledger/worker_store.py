"""Every SQL statement of the worker. Functions take `conn` and never commit.

Three short transactions make one attempt (ledger.worker opens them):
claim (lease + attempt row), complete (handler effects + receipt + job end),
and, when the handler raised, record the failure. Each write is fenced by the
lease token: `complete_job` deletes the job only while the token is ours, and
the failure path starts with `hold_lease`; a worker whose lease was taken over
finds its token gone and changes nothing.

Hot statements are built once at import and run with a plain parameter dict
(building `update(...).values(...)` per call cost most of the worker's CPU,
as it did the intake's: bench/README.md, "Workers"). On PostgreSQL the claim
and the completion's writes are one statement each (data-modifying CTEs);
SQLite runs the same steps as simple statements inside its BEGIN IMMEDIATE.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Dialect,
    Integer,
    Select,
    Text,
    TextClause,
    bindparam,
    column,
    delete,
    insert,
    select,
    text,
    update,
)

from ledger.db import driver_error
from ledger.domain import JobStatus, ReceiptState
from ledger.schema import UTCDateTime, attempts, jobs, receipts

ERROR_LIMIT = 500
LOST_ERROR = "WorkerLost: the lease expired before the attempt reported an outcome"


@dataclass(frozen=True, slots=True, kw_only=True)
class DueJob:
    """A claimable job as the claim query found it (still locked by the claim transaction)."""

    scope_id: int
    event_id: str
    event_type: str
    window_start: datetime  # jobs.accepted_at: acceptance, or the operator's last requeue
    attempts: int  # attempts started since the window opened
    lease_token: int
    payload: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedJob:
    """A job leased to one worker: the token fences every later write."""

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


_TIMES = ("now", "leased_until", "oldest_window")

# PostgreSQL claim: due_job_query + lease_job in one round trip. `due` locks the
# job (same clauses and reasons as due_job_query; {due} adds the conditions of
# COMPLETE_AND_CLAIM_SQL); `counted` counts the attempt on the receipt
# unless the job may not start (out of attempts or too old: the worker then
# ends it with fail_unstarted) or its receipt is gone; `leased` writes the new
# fencing token and pushes run_at to the lease's end; `opened` starts this
# attempt's row. A job that had attempts in its window may have one whose
# worker vanished: the caller closes it right after (see _claim_of), outside
# this statement, which runs once per job: the extra UPDATE here cost every
# claim ~0.1 ms of PostgreSQL CPU (bench/README.md, "Workers").
_CLAIM_CTES = """
due AS MATERIALIZED (
    SELECT scope_id, event_id, event_type, accepted_at, attempts, lease_token, payload
    FROM jobs
    WHERE status = 0 AND run_at <= :now{due}
    ORDER BY run_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), counted AS (
    UPDATE receipts r SET attempts = r.attempts + 1
    FROM due
    WHERE r.scope_id = due.scope_id AND r.event_id = due.event_id
      AND due.attempts < :max_attempts AND due.accepted_at >= :oldest_window
    RETURNING r.scope_id, r.event_id, r.attempts, r.accepted_at
), leased AS (
    UPDATE jobs j SET attempts = j.attempts + 1, lease_token = j.lease_token + 1,
                      leased_by = :worker_id, leased_until = :leased_until,
                      run_at = :leased_until
    FROM counted
    WHERE j.scope_id = counted.scope_id AND j.event_id = counted.event_id
    RETURNING j.lease_token
), opened AS (
    INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token, started_at)
    SELECT counted.scope_id, counted.event_id, counted.attempts, :worker_id,
           due.lease_token + 1, :now
    FROM due, counted
    RETURNING 1
)"""
_CLAIM_COLUMNS = """
       due.scope_id, due.event_id, due.event_type, due.accepted_at, due.attempts,
       due.lease_token, due.payload, counted.attempts AS number,
       counted.accepted_at AS receipt_accepted_at"""
# Positional columns: SQLAlchemy caches the result layout (by name it rebuilds it per call).
_CLAIM_RESULT = (
    column("scope_id", Integer), column("event_id", Text), column("event_type", Text),
    column("accepted_at", UTCDateTime), column("attempts", Integer),
    column("lease_token", BigInteger), column("payload", Text), column("number", Integer),
    column("receipt_accepted_at", UTCDateTime))

CLAIM_SQL = text(
    "WITH" + _CLAIM_CTES.format(due="") + "\nSELECT" + _CLAIM_COLUMNS
    + "\nFROM due LEFT JOIN counted ON true"
).bindparams(*(bindparam(name, type_=UTCDateTime) for name in _TIMES)).columns(*_CLAIM_RESULT)

# PostgreSQL completion after the handler, in one statement. `gone` is the fence:
# the job goes only while our token is still its token, so a worker whose lease
# was taken over deletes nothing, and its caller rolls back (the handler's
# writes too). The receipt and the attempt join `gone` (0 or 1 row): they
# change only after it and only if it held; each names its row by scope and
# id. A job row is locked before its receipt here as in every other writer, so
# two completions cannot deadlock on them.
_COMPLETE_CTES = """
gone AS (
    DELETE FROM jobs
    WHERE scope_id = :sid AND event_id = :eid AND lease_token = :token AND status = 0
    RETURNING scope_id, event_id
), done AS (
    UPDATE receipts r SET state = :complete, completed_at = :now, result_ref = :result_ref
    FROM gone WHERE r.scope_id = :sid AND r.event_id = :eid
    RETURNING 1
), closed AS (
    UPDATE attempts a SET finished_at = :now, outcome = 'complete', error = NULL
    FROM gone WHERE a.scope_id = :sid AND a.event_id = :eid
      AND a.number = :number AND a.lease_token = :token
    RETURNING 1
)"""
COMPLETE_SQL = text(
    "WITH" + _COMPLETE_CTES + "\nSELECT count(*) AS held FROM gone"
).bindparams(bindparam("now", type_=UTCDateTime)).columns(column("held", Integer))

# The completion that also claims the next due job (the claim CTEs, never the
# job just finished, and only if the fence held), so that claim commits with
# this completion: one commit per job instead of two. The next attempt is
# still counted and leased in a commit of its own before its handler runs,
# which is all the separate claim commit was for: a job that kills its worker
# still spends its attempts, and the worker holds one lease at a time.
COMPLETE_AND_CLAIM_SQL = text(
    "WITH" + _COMPLETE_CTES + "," + _CLAIM_CTES.format(
        due="\n      AND EXISTS (SELECT FROM gone)"
            "\n      AND NOT (scope_id = :sid AND event_id = :eid)")
    + "\nSELECT (SELECT count(*) FROM gone) AS held," + _CLAIM_COLUMNS
    + "\nFROM (SELECT) AS one LEFT JOIN due ON true LEFT JOIN counted ON true"
).bindparams(*(bindparam(name, type_=UTCDateTime) for name in _TIMES)).columns(
    column("held", Integer), *_CLAIM_RESULT)



class DriverStatement:
    """A hot PostgreSQL statement run on the driver connection, in the caller's transaction.

    The completion runs once per job, and SQLAlchemy's execution machinery
    (execution context, cursor result, row objects) cost about as much Python
    as the driver call itself; on the driver the worker's client CPU per job
    fell by about a tenth (bench/README.md, "Workers"), as the intake's did
    with store.DriverClaim. The statement still runs inside the transaction
    the handler's writes are in (the same pooled connection). Parameters and
    rows get the same conversions as through SQLAlchemy (timestamps in UTC);
    driver errors are raised as SQLAlchemy's, without parameters, and a
    broken connection is invalidated, as SQLAlchemy would.
    """

    def __init__(self, statement: TextClause) -> None:
        self.statement = statement
        self._compiled: dict[str, tuple[str, Any, Any]] = {}  # per dialect name

    def sql(self, dialect: Dialect) -> str:
        """Return the statement as the driver receives it."""
        return self._prepared(dialect)[0]

    def _prepared(self, dialect: Dialect) -> tuple[str, Any, Any]:
        """Return (SQL, parameter converter, row converter) for `dialect`, built once."""
        found = self._compiled.get(dialect.name)
        if found is None:
            compiled = self.statement.compile(dialect=dialect)
            times = [name for name, bind in compiled.binds.items()
                     if isinstance(bind.type, UTCDateTime)]
            to_driver = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
            columns = [(col.key, col.type) for col in self.statement.selected_columns]
            shape = namedtuple("DriverRow", [key for key, _ in columns])  # type: ignore[misc]
            readers = [(i, kind.dialect_impl(dialect).result_processor(dialect, None))
                       for i, (_, kind) in enumerate(columns)]
            readers = [(i, read) for i, read in readers if read is not None]

            def params(values: dict[str, Any]) -> dict[str, Any]:
                if to_driver is not None:
                    values.update({name: to_driver(values[name]) for name in times})
                return values

            def row(values: tuple[Any, ...]) -> Any:
                if readers:
                    values = list(values)  # type: ignore[assignment]
                    for i, read in readers:
                        values[i] = read(values[i])  # type: ignore[index]
                return shape._make(values)

            found = self._compiled[dialect.name] = (compiled.string, params, row)
        return found

    def row(self, conn: Connection, params: dict[str, Any]) -> Any:
        """Run the statement with `params` (a dict it may change); return its one row."""
        sql, convert_params, convert_row = self._prepared(conn.dialect)
        fairy = conn.connection
        cursor = fairy.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql, convert_params(params))
            values = cursor.fetchone()
        except conn.dialect.loaded_dbapi.Error as error:
            invalidated = conn.dialect.is_disconnect(error, fairy.dbapi_connection, cursor)
            if invalidated:
                conn.invalidate(error)
            raise driver_error(conn.dialect, error, what="worker completion",
                               invalidated=invalidated) from error
        finally:
            cursor.close()
        if values is None:
            raise RuntimeError("the completion statement returned no row")
        return convert_row(values)


DRIVER_COMPLETE = DriverStatement(COMPLETE_SQL)
DRIVER_COMPLETE_AND_CLAIM = DriverStatement(COMPLETE_AND_CLAIM_SQL)

_DUE = due_job_query()
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


def select_due_job(conn: Connection, now: datetime) -> DueJob | None:
    """Find and lock the oldest due job that no other worker holds."""
    row = conn.execute(_DUE, {"now": now}).first()
    return None if row is None else _due(row)


def _due(row: Any) -> DueJob:
    """Return the due job of a claim row."""
    return DueJob(scope_id=row.scope_id, event_id=row.event_id, event_type=row.event_type,
                  window_start=row.accepted_at, attempts=row.attempts,
                  lease_token=row.lease_token, payload=row.payload)


Claim = tuple[DueJob, ClaimedJob | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """Who claims the next due job, at what time, for how long, within which limits."""

    worker_id: str
    now: datetime
    lease_seconds: int
    limits: ClaimLimits

    @property
    def leased_until(self) -> datetime:
        """Return the end of the lease this claim writes."""
        return self.now + timedelta(seconds=self.lease_seconds)

    def params(self) -> dict[str, Any]:
        """Return the claim statement's parameters."""
        return {"now": self.now, "leased_until": self.leased_until,
                "oldest_window": self.limits.oldest_window,
                "max_attempts": self.limits.max_attempts, "worker_id": self.worker_id}


def claim_next(conn: Connection, request: ClaimRequest) -> Claim | None:
    """Lock the oldest due job and lease it unless it may not start; None when none is due.

    The job is (due, None) when it may not start (see ClaimLimits) or has no
    receipt; nothing was counted or leased then, and the caller ends it.
    """
    if conn.dialect.name == "postgresql":
        return _claim_of(conn, conn.execute(CLAIM_SQL, request.params()).first(), request)
    due = select_due_job(conn, request.now)
    if due is None:
        return None
    limits = request.limits
    if due.attempts >= limits.max_attempts or due.window_start < limits.oldest_window:
        return due, None
    return due, lease_job(conn, due, worker_id=request.worker_id, now=request.now,
                          lease_seconds=request.lease_seconds)


def _claim_of(conn: Connection, row: Any, request: ClaimRequest) -> Claim | None:
    """Return the claim a CLAIM_SQL or COMPLETE_AND_CLAIM_SQL row describes (None: none due).

    A job that had attempts in its window may have one whose worker vanished
    (its lease expired with no outcome): close it now, on the claim's
    connection (inside the completion's transaction for a chained claim). A
    worker that dies before this leaves it open; the next claim closes it.
    """
    if row is None or row.scope_id is None:
        return None
    due = _due(row)
    if row.number is None:
        return due, None
    lost = 0
    if due.attempts:
        lost = mark_lost_attempts(conn, due.scope_id, due.event_id, request.now,
                                  below=row.number)
    return due, _claimed(due, number=row.number, accepted_at=row.receipt_accepted_at,
                         leased_until=request.leased_until, lost=lost)


def _claimed(due: DueJob, *, number: int, accepted_at: datetime, leased_until: datetime,
             lost: int) -> ClaimedJob:
    """Return the leased job: the token is the one the claim wrote (the old one + 1)."""
    return ClaimedJob(
        scope_id=due.scope_id, event_id=due.event_id, event_type=due.event_type,
        payload=due.payload, window_start=due.window_start, accepted_at=accepted_at,
        attempt=due.attempts + 1, number=number, lease_token=due.lease_token + 1,
        leased_until=leased_until, lost=lost)


def lease_job(conn: Connection, due: DueJob, *, worker_id: str, now: datetime,
              lease_seconds: int) -> ClaimedJob | None:
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


def fail_unstarted(conn: Connection, due: DueJob, *, worker_id: str, reason: str,
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
    return int(started)


def relock_due(conn: Connection, due: DueJob) -> bool:
    """Lock a job found by an earlier claim if no worker changed it since (before ending it)."""
    key = {"sid": due.scope_id, "eid": due.event_id, "token": due.lease_token,
           "tries": due.attempts}
    return conn.execute(_RELOCK, key).first() is not None


def hold_lease(conn: Connection, job: ClaimedJob) -> bool:
    """Lock the job if our fencing token is still current (the first statement of a write).

    PostgreSQL: FOR UPDATE makes a concurrent claim skip the row until we commit,
    and waits out a claim in flight, then re-reads the token. SQLite: the
    transaction's BEGIN IMMEDIATE write lock already excludes every other writer.
    """
    key = {"sid": job.scope_id, "eid": job.event_id, "token": job.lease_token}
    return conn.execute(_HOLD, key).first() is not None


def finish_attempt(conn: Connection, job: ClaimedJob, *, outcome: str, now: datetime,
                   error: str | None = None) -> None:
    """Record how this attempt ended."""
    conn.execute(_FINISH, {
        "sid": job.scope_id, "eid": job.event_id, "num": job.number,
        "token": job.lease_token, "now": now, "how": outcome,
        "err": error[:ERROR_LIMIT] if error is not None else None})


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What complete_job did. held=False: the lease was taken over, roll back."""

    held: bool
    next: Claim | None = None  # the job claimed in the same transaction, if asked


def complete_job(conn: Connection, job: ClaimedJob, *, result_ref: str, now: datetime,
                 then_claim: ClaimRequest | None = None) -> Completion:
    """End the job if our lease still holds: receipt complete, job and payload gone.

    The job row is the fence: it is deleted only while our token is still its
    token. With `then_claim`, the next due job is claimed in the same
    transaction (see COMPLETE_AND_CLAIM_SQL); the caller commits both at once.
    """
    key = {"sid": job.scope_id, "eid": job.event_id, "token": job.lease_token}
    if conn.dialect.name == "postgresql":
        params = {**key, "now": now, "complete": ReceiptState.COMPLETE.code,
                  "result_ref": result_ref, "number": job.number}
        if then_claim is None:
            return Completion(held=bool(DRIVER_COMPLETE.row(conn, params).held))
        row = DRIVER_COMPLETE_AND_CLAIM.row(conn, {**then_claim.params(), **params})
        return Completion(held=bool(row.held),
                          next=_claim_of(conn, row, then_claim) if row.held else None)
    if conn.execute(_FENCED_DELETE, key).rowcount != 1:
        return Completion(held=False)
    conn.execute(_RECEIPT_DONE, {"sid": job.scope_id, "eid": job.event_id, "now": now,
                                 "ref": result_ref})
    finish_attempt(conn, job, outcome="complete", now=now)
    return Completion(held=True, next=claim_next(conn, then_claim) if then_claim else None)


def schedule_retry(conn: Connection, job: ClaimedJob, *, run_at: datetime) -> None:
    """Release the lease and make the job due again at `run_at`."""
    conn.execute(_RETRY, {"sid": job.scope_id, "eid": job.event_id, "due_at": run_at})


def fail_job(conn: Connection, job: ClaimedJob, *, now: datetime) -> None:
    """Make the receipt failed (terminal, reviewable); the job keeps its payload for review."""
    conn.execute(_RECEIPT_FAILED, {"sid": job.scope_id, "eid": job.event_id, "now": now})
    set_job_failed(conn, job.scope_id, job.event_id)


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
