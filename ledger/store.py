"""Every SQL statement of the intake's hot path. Functions take `conn` and never commit.

Each statement filters on the consumer scope (`scope_id`) first: the ledger can
then be distributed or split by scope (see README, "Scaling past one database").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, LargeBinary, bindparam, select, text
from sqlalchemy.dialects import postgresql, sqlite

from ledger.domain import ConflictKind, JobStatus, ReceiptState
from ledger.schema import UTCDateTime, conflicts, jobs, receipts, unsigned_bodies


def _insert(conn: Connection, table: Any) -> Any:
    """Return the dialect's INSERT, which knows ON CONFLICT."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An authenticated, validated delivery ready to be claimed."""

    scope_id: int
    event_id: str
    event_type: str
    body_sha256: bytes
    payload: str
    accepted_at: datetime


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
    CPU on PostgreSQL (bench/README.md, "Intake CPU"). Prebuilt statements run
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
    }


_STATEMENTS = {"postgresql": _statements(postgresql), "sqlite": _statements(sqlite)}


# PENDING = 0 and QUEUED = 0 (ledger.domain). The job insert reads the receipt
# insert's RETURNING, so a taken id (ON CONFLICT DO NOTHING returns nothing)
# inserts no job; the last SELECT then answers with the recorded receipt. It runs
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
                      lease_token, payload)
    SELECT scope_id, event_id, :event_type, :accepted_at, :accepted_at, 0, 0, 0, :payload
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


def claim_receipt_with_job(conn: Connection,
                           event: NewEvent) -> tuple[bool, RecordedOutcome | None]:
    """Insert the pending receipt and its job, or read the receipt that holds the id.

    Returns (True, None) when claimed; (False, outcome) for a taken id, where
    the outcome is None if the holder is not visible (yet, or any more).
    On PostgreSQL one statement does it all (see _CLAIM_WITH_JOB): one round
    trip for a new delivery and for a duplicate. SQLite runs the statements.
    """
    if conn.dialect.name != "postgresql":
        if claim_receipt(conn, event):
            enqueue_job(conn, event)
            return True, None
        return False, recorded_outcome(conn, event.scope_id, event.event_id)
    params = {"scope_id": event.scope_id, "event_id": event.event_id,
              "event_type": event.event_type, "accepted_at": event.accepted_at,
              "body_sha256": event.body_sha256, "payload": event.payload}
    row = conn.execute(_CLAIM_WITH_JOB, params).first()
    if row is None:
        return False, None
    if row.claimed:
        return True, None
    return False, RecordedOutcome(state=ReceiptState.from_code(row.state),
                                  body_sha256=bytes(row.body_sha256),
                                  result_ref=row.result_ref)


def enqueue_job(conn: Connection, event: NewEvent) -> None:
    """Insert the durable work item that carries the payload to a worker."""
    conn.execute(_statement(conn, "job"), {
        "scope_id": event.scope_id, "event_id": event.event_id,
        "event_type": event.event_type, "accepted_at": event.accepted_at,
        "run_at": event.accepted_at, "status": JobStatus.QUEUED.value, "attempts": 0,
        "lease_token": 0, "payload": event.payload})


def claim_unsigned_body(conn: Connection, event: NewEvent) -> bool:
    """Record the body digest for a profile with unsigned ids; False when seen before."""
    row = {"scope_id": event.scope_id, "body_sha256": event.body_sha256,
           "event_id": event.event_id, "accepted_at": event.accepted_at}
    return conn.execute(_statement(conn, "unsigned"), row).first() is not None


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


def record_conflict(
    conn: Connection, *, scope_id: int, event_id: str, kind: ConflictKind,
    original_event_id: str, original_sha256: bytes, incoming_sha256: bytes, now: datetime,
) -> None:
    """Record (or count again) a delivery that contradicts the ledger."""
    stmt = _insert(conn, conflicts).values(
        scope_id=scope_id, event_id=event_id, kind=kind.value,
        original_event_id=original_event_id, original_sha256=original_sha256,
        incoming_sha256=incoming_sha256, first_seen=now, last_seen=now, count=1,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["scope_id", "event_id", "incoming_sha256"],
        set_={"last_seen": now, "count": conflicts.c.count + 1},
    )
    conn.execute(stmt)
