"""Every SQL statement of the intake's hot path. Functions take `conn` and never commit;
DriverClaim, the signed-id claim, runs its own transaction on a pooled driver connection.

Each statement filters on the consumer scope (`scope_id`) first: the ledger can
then be distributed or split by scope (see README, "Scaling past one database").
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, LargeBinary, bindparam, select, text
from sqlalchemy.dialects import postgresql, sqlite

from ledger.db import citus
from ledger.db.driver import DriverStatement, ThreadConnections, run_pooled, time_to_driver
from ledger.db.engine import conflict_insert, driver_error, sqlite_file
from ledger.db.schema import (
    UTCDateTime,
    conflicts,
    jobs,
    receipts,
    sender_tokens,
    unsigned_bodies,
)
from ledger.db.writer_turns import writer_turns
from ledger.domain import ConflictKind, JobStatus, ReceiptState
from ledger.errors import StorageUnavailable
from ledger.intake.group_commit import Failed, GroupCommit
from ledger.metrics import SQLITE_CLAIMS_PER_COMMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An authenticated, validated delivery ready to be claimed."""

    scope_id: int
    event_id: str
    event_type: str
    body_sha256: bytes
    payload: str
    accepted_at: datetime
    content_type: str | None = None  # as received (ledger.intake.signatures._common)
    raw_body: str | None = None  # a form's body as received; `payload` holds its fields
    # A signature's one-time token (Mailgun) and when its signed timestamp leaves the
    # freshness window: claimed with the event (claim_sender_token).
    token: str | None = None
    token_expires_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedOutcome:
    """What the ledger already holds for a (scope, event id)."""

    state: ReceiptState
    body_sha256: bytes
    result_ref: str | None


def _statements(dialect: Any) -> dict[str, Any]:
    """Build the hot path's INSERTs once per dialect; each call only binds values.

    Building `insert(...).values(**row)` per request constructs a bound parameter
    per column and a fresh cache key every time: about a third of the intake's
    CPU on PostgreSQL. Prebuilt statements run
    from SQLAlchemy's compiled cache with a plain parameter dict.
    """
    return {
        "receipt": dialect.insert(receipts)
        .on_conflict_do_nothing(index_elements=["scope_id", "event_id"])
        .returning(receipts.c.scope_id),
        "job": dialect.insert(jobs),
        "unsigned": dialect.insert(unsigned_bodies)
        .on_conflict_do_nothing(index_elements=["scope_id", "body_sha256"])
        .returning(unsigned_bodies.c.scope_id),
        "token": dialect.insert(sender_tokens)
        .on_conflict_do_nothing(index_elements=["scope_id", "token"])
        .returning(sender_tokens.c.scope_id),
    }


_STATEMENTS = {"postgresql": _statements(postgresql), "sqlite": _statements(sqlite)}


# PENDING = 0 and QUEUED = 0 (ledger.domain). The work item's insert reads the receipt
# insert's RETURNING, so a taken id (ON CONFLICT DO NOTHING returns nothing)
# inserts no work item; the last SELECT then answers with the recorded receipt. It runs
# on the statement's snapshot: a receipt committed by a concurrent delivery after
# it began is not visible, and the caller claims again (Intake._claim's loop).
_CLAIM_WITH_JOB = text("""
WITH claimed AS (
    INSERT INTO receipts (accepted_at, scope_id, state, attempts, event_id, event_type,
                          body_sha256)
    VALUES (:accepted_at, :scope_id, 0, 0, :event_id, :event_type, :body_sha256)
    ON CONFLICT (scope_id, event_id) DO NOTHING
    RETURNING scope_id, event_id
), queued AS (
    INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status, attempts,
                      lease_token, payload, content_type, raw_body)
    SELECT scope_id, event_id, :event_type, :accepted_at, :accepted_at, 0, 0, 0, :payload,
           :content_type, :raw_body
    FROM claimed
    RETURNING 1
)
SELECT true AS claimed, NULL::smallint AS state, NULL::bytea AS body_sha256,
       NULL::text AS result_ref
FROM queued
UNION ALL
SELECT false, r.state, r.body_sha256, r.result_ref
FROM receipts r
WHERE r.scope_id = :scope_id AND r.event_id = :event_id
  AND NOT EXISTS (SELECT 1 FROM claimed)
""").bindparams(bindparam("accepted_at", type_=UTCDateTime),
                bindparam("body_sha256", type_=LargeBinary))
_DRIVER_CLAIM = DriverStatement(_CLAIM_WITH_JOB, what="intake claim")


def _statement(conn: Connection, name: str) -> Any:
    """Return the prebuilt statement `name` for the connection's dialect."""
    return _STATEMENTS["postgresql" if conn.dialect.name == "postgresql" else "sqlite"][name]


def claim_receipt(conn: Connection, event: NewEvent) -> bool:
    """Insert the pending receipt; False when (scope, event id) is already claimed.

    ON CONFLICT DO NOTHING makes the database decide between concurrent
    deliveries: a SELECT-then-INSERT would let both see absence.
    """
    row = {"scope_id": event.scope_id, "event_id": event.event_id,
           "event_type": event.event_type, "state": ReceiptState.PENDING.code, "attempts": 0,
           "accepted_at": event.accepted_at, "body_sha256": event.body_sha256}
    return conn.execute(_statement(conn, "receipt"), row).first() is not None


# The signed-id claim on SQLite: the same rows as the prebuilt statements above,
# written for the driver (qmark parameters). Literal codes: PENDING = QUEUED = 0.
_SQLITE_RECEIPT = ("INSERT INTO receipts (accepted_at, scope_id, state, attempts, event_id,"
                   " event_type, body_sha256) VALUES (?, ?, 0, 0, ?, ?, ?)"
                   " ON CONFLICT (scope_id, event_id) DO NOTHING RETURNING scope_id")
_SQLITE_JOB = ("INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status,"
               " attempts, lease_token, payload, content_type, raw_body)"
               " VALUES (?, ?, ?, ?, ?, 0, 0, 0, ?, ?, ?)")
_SQLITE_OUTCOME = ("SELECT state, body_sha256, result_ref FROM receipts"
                   " WHERE scope_id = ? AND event_id = ?")
# The same two-insert claim on a distributed (Citus) ledger. `_CLAIM_WITH_JOB` cannot be
# routed there: Citus runs its INSERT ... SELECT from a CTE by pulling the rows to the
# coordinator and sending them to every node, so each claim became a two-phase commit
# across all workers. Each statement below names one scope, so all go to the node that
# holds it and the transaction commits there, in one phase (README, "Scaling past one
# database").
_CITUS_RECEIPT = _SQLITE_RECEIPT.replace("?", "%s")
_CITUS_JOB = _SQLITE_JOB.replace("?", "%s")
_CITUS_OUTCOME = _SQLITE_OUTCOME.replace("?", "%s")


# The most SQLite claims one transaction holds (ledger.intake.group_commit). Batches
# form only from claims that are already waiting: 3.3 on average under the bench's
# 16 connections, so the limit bounds a burst, not the usual case.
GROUP_COMMIT_LIMIT = 64


class DriverClaim:
    """Claim a signed event id with its work item, on the driver connection, no SQLAlchemy.

    The claim is the intake's one hot statement, and SQLAlchemy's execution
    machinery (connection and result objects, execution options, type
    processing) cost more Python than the driver call itself. It runs through `ledger.db.driver`
    (the engine's connect-time settings and timeouts):

    - PostgreSQL: `_CLAIM_WITH_JOB`, one statement in autocommit (its own
      transaction): receipt + work item, or the recorded receipt for a taken id,
      on the thread's own connection (`ledger.db.driver.ThreadConnections`).
    - SQLite: BEGIN IMMEDIATE, insert the receipt, then the work item, or read the
      recorded receipt, COMMIT; the claims waiting in this process share that
      transaction, a savepoint each (`GroupCommit`, `group_limit` of them at
      most).
    - PostgreSQL with the ledger distributed by Citus (`ledger db distribute`):
      the same statements as on SQLite, in one transaction on the scope's node.

    Driver errors are raised as the SQLAlchemy errors the rest of the ledger
    handles (`storage_guard`), without parameters in the message; a broken pooled
    connection is invalidated instead of going back to the pool, and a thread's own
    is closed after any driver error.
    """

    def __init__(self, engine: Engine, group_limit: int = GROUP_COMMIT_LIMIT, *,
                 own_connections: int | None = None) -> None:
        self._engine = engine
        dialect = engine.dialect
        self._postgresql = dialect.name == "postgresql"
        self._when = time_to_driver(dialect)
        self._prepared = _DRIVER_CLAIM.prepared(dialect) if self._postgresql else None
        self._distributed: bool | None = None  # read on the first claim: no I/O here
        # PostgreSQL: up to `own_connections` web threads (LEDGER_DB_CLAIM_CONNECTIONS; as
        # many as the pool has connections when None) claim on one of their own, opened on
        # the first claim, not one checked out for every claim. SQLite claims on the pool.
        if own_connections is None:
            own_connections = getattr(engine.pool, "size", lambda: 0)()
        self._own = ThreadConnections(engine, limit=own_connections if self._postgresql else 0)
        # SQLite: the claims that reach this process together share one transaction
        # (ledger.intake.group_commit); a limit of 1 writes each claim alone.
        self._group: GroupCommit[NewEvent, Any] | None = None
        if not self._postgresql:
            database = engine.url.database
            gate = writer_turns(database).held if sqlite_file(database) else nullcontext
            self._group = GroupCommit(self._write_sqlite_group, group_limit, gate)

    @property
    def distributed(self) -> bool:
        """Tell whether the ledger is distributed (Citus): then the two-insert claim runs."""
        if self._distributed is None:
            self._distributed = citus.distributed(self._engine)
        return self._distributed

    @property
    def statements(self) -> tuple[str, ...]:
        """Return the SQL this claim runs (it bypasses the engine's statement events)."""
        if self._postgresql and self.distributed:
            return (_CITUS_RECEIPT, _CITUS_JOB, _CITUS_OUTCOME)
        if self._prepared is not None:
            return (self._prepared.sql,)
        return (_SQLITE_RECEIPT, _SQLITE_JOB, _SQLITE_OUTCOME)

    def claim(self, event: NewEvent) -> tuple[bool, RecordedOutcome | None]:
        """Return (True, None) when claimed, else (False, the recorded outcome or None).

        The outcome is None when the holder of the id is not visible (yet, or
        any more): the caller claims again.
        """
        if self._group is not None:
            row = self._group.submit(event)
        elif self._postgresql and self.distributed:
            row = run_pooled(self._engine, self._claim_distributed, event,
                             what=_DRIVER_CLAIM.what)
        else:
            row = self._own.run(self._claim_postgresql, event, what=_DRIVER_CLAIM.what)
        if row is True:
            return True, None
        if row is None:
            return False, None
        return False, RecordedOutcome(state=ReceiptState.from_code(row[0]),
                                      body_sha256=bytes(row[1]), result_ref=row[2])

    def close(self) -> None:
        """Close the threads' own claim connections (the process is stopping)."""
        self._own.close()

    def _claim_postgresql(self, cursor: Any, event: NewEvent) -> Any:
        assert self._prepared is not None  # built for PostgreSQL in __init__
        # `cursor` is of a connection in autocommit (the thread's own, or a pooled one
        # switched for this claim): the statement is its own transaction.
        row = self._prepared.fetch_one_on(cursor, {
            "scope_id": event.scope_id, "event_id": event.event_id,
            "event_type": event.event_type, "accepted_at": event.accepted_at,
            "body_sha256": event.body_sha256, "payload": event.payload,
            "content_type": event.content_type, "raw_body": event.raw_body})
        if row is None:
            return None
        return True if row[0] else row[1:]

    def _claim_distributed(self, conn: Any, event: NewEvent) -> Any:
        when = self._when(event.accepted_at)
        with conn.cursor() as cursor:  # the pooled connection is not in autocommit
            taken = cursor.execute(_CITUS_RECEIPT, (
                when, event.scope_id, event.event_id, event.event_type,
                event.body_sha256)).fetchone() is None
            if taken:
                row = cursor.execute(_CITUS_OUTCOME, (event.scope_id, event.event_id)).fetchone()
            else:
                cursor.execute(_CITUS_JOB, (event.scope_id, event.event_id, event.event_type,
                                            when, when, event.payload, event.content_type,
                                            event.raw_body))
                row = True
        conn.commit()
        return row

    def _write_sqlite_group(self, events: Sequence[NewEvent]) -> list[Any]:
        """Claim `events` in one SQLite transaction, each under its own savepoint."""
        rows = run_pooled(self._engine, self._claim_sqlite_many, events,
                          what=_DRIVER_CLAIM.what)
        SQLITE_CLAIMS_PER_COMMIT.observe(len(events))  # committed: a failed one is not counted
        return rows

    def _claim_sqlite_many(self, conn: Any, events: Sequence[NewEvent]) -> list[Any]:
        # A claim's own constraint error (an orphan work item holding its id, say) rolls back
        # to its savepoint and answers it alone; any other error ends the transaction
        # and is every claim's (run_pooled translates it, the pool rolls back).
        rows: list[Any] = []
        cursor = conn.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
            for event in events:
                cursor.execute("SAVEPOINT claim")
                try:
                    rows.append(self._claim_sqlite_one(cursor, event))
                except conn.IntegrityError as error:  # this claim's own: undo it alone
                    cursor.execute("ROLLBACK TO claim")
                    rows.append(Failed(driver_error(self._engine.dialect, error,
                                                    what=_DRIVER_CLAIM.what)))
                cursor.execute("RELEASE claim")
            cursor.execute("COMMIT")
            return rows
        finally:
            cursor.close()

    def _claim_sqlite_one(self, cursor: Any, event: NewEvent) -> Any:
        when = self._when(event.accepted_at)
        taken = cursor.execute(_SQLITE_RECEIPT, (
            when, event.scope_id, event.event_id, event.event_type,
            event.body_sha256)).fetchone() is None
        if taken:
            return cursor.execute(_SQLITE_OUTCOME, (event.scope_id, event.event_id)).fetchone()
        cursor.execute(_SQLITE_JOB, (event.scope_id, event.event_id, event.event_type,
                                     when, when, event.payload, event.content_type,
                                     event.raw_body))
        return True


def enqueue_job(conn: Connection, event: NewEvent) -> None:
    """Insert the durable work item that carries the payload to a worker."""
    conn.execute(_statement(conn, "job"), {
        "scope_id": event.scope_id, "event_id": event.event_id,
        "event_type": event.event_type, "accepted_at": event.accepted_at,
        "run_at": event.accepted_at, "status": JobStatus.QUEUED.value, "attempts": 0,
        "lease_token": 0, "payload": event.payload, "content_type": event.content_type,
        "raw_body": event.raw_body})


def claim_unsigned_body(conn: Connection, event: NewEvent) -> bool:
    """Record the body digest for a profile with unsigned ids; False when seen before."""
    row = {"scope_id": event.scope_id, "body_sha256": event.body_sha256,
           "event_id": event.event_id, "accepted_at": event.accepted_at}
    return conn.execute(_statement(conn, "unsigned"), row).first() is not None


def claim_sender_token(conn: Connection, event: NewEvent) -> bool:
    """Record the event's signature token; False when another event (another id, or another
    body under the id) used it first. The same event with its token again is a retry: True.

    On PostgreSQL a concurrent claim of the token waits for the first one's transaction,
    then sees its row (or, if it rolled back, claims the token itself).
    """
    row = {"scope_id": event.scope_id, "token": event.token, "event_id": event.event_id,
           "body_sha256": event.body_sha256, "expires_at": event.token_expires_at}
    for _ in range(3):
        if conn.execute(_statement(conn, "token"), row).first() is not None:
            return True
        used = conn.execute(
            select(sender_tokens.c.event_id, sender_tokens.c.body_sha256).where(
                sender_tokens.c.scope_id == event.scope_id,
                sender_tokens.c.token == event.token)).first()
        if used is not None:
            return used.event_id == event.event_id and bytes(used.body_sha256) == (
                event.body_sha256)
    raise StorageUnavailable("a signature token's record changed under this delivery")


def original_of_body(conn: Connection, scope_id: int, body_sha256: bytes) -> str | None:
    """Return the event id under which this body was first accepted in the scope."""
    return conn.execute(
        select(unsigned_bodies.c.event_id).where(
            unsigned_bodies.c.scope_id == scope_id,
            unsigned_bodies.c.body_sha256 == body_sha256)
    ).scalar()


def recorded_outcome(conn: Connection, scope_id: int, event_id: str) -> RecordedOutcome | None:
    """Return the state, digest and result of an existing receipt."""
    row = conn.execute(
        select(receipts.c.state, receipts.c.body_sha256, receipts.c.result_ref).where(
            receipts.c.scope_id == scope_id, receipts.c.event_id == event_id)
    ).first()
    if row is None:
        return None
    return RecordedOutcome(state=ReceiptState.from_code(row.state),
                           body_sha256=bytes(row.body_sha256), result_ref=row.result_ref)


# A conflicting body is kept for review up to this many bytes (UTF-8); a larger
# one keeps only its size, so a flood of large forgeries under a taken id cannot
# fill the conflicts table.
CONFLICT_BODY_LIMIT = 64 * 1024


def record_conflict(
    conn: Connection, *, scope_id: int, event_id: str, kind: ConflictKind,
    original_event_id: str, original_sha256: bytes, incoming_sha256: bytes, now: datetime,
    incoming_body: str | None = None,
) -> None:
    """Record (or count again) a delivery that contradicts the ledger.

    The first delivery of a conflicting body keeps it (when under the cap) for
    the review window; later deliveries of the same body only count.
    """
    size = len(incoming_body.encode()) if incoming_body is not None else None
    kept = incoming_body if size is not None and size <= CONFLICT_BODY_LIMIT else None
    stmt = conflict_insert(conn, conflicts).values(
        scope_id=scope_id, event_id=event_id, kind=kind.value,
        original_event_id=original_event_id, original_sha256=original_sha256,
        incoming_sha256=incoming_sha256, first_seen=now, last_seen=now, count=1,
        incoming_body=kept, incoming_size=size,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["scope_id", "event_id", "incoming_sha256"],
        set_={"last_seen": now, "count": conflicts.c.count + 1},
    )
    conn.execute(stmt)
