"""Write ledger rows directly, as if the intake and the worker had run at a given time."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from ledger.db.schema import attempts, conflicts, jobs, receipts, unsigned_bodies
from ledger.domain import JobStatus, ReceiptState
from ledger.worker.failure_groups import record_failure


def add_receipt(conn: Connection, scope_id: int, event_id: str, *, state: ReceiptState,
                accepted_at: datetime, job: JobStatus | None = None,
                payload: str | None = '{"data":{"amount":1}}', n_attempts: int = 1,
                run_at: datetime | None = None, leased_until: datetime | None = None,
                unsigned: bool = False, conflict: bool = False) -> bytes:
    """Insert one receipt with optional job, attempts, unsigned body and conflict."""
    digest = hashlib.sha256(f"{scope_id}:{event_id}".encode()).digest()
    done = accepted_at + timedelta(seconds=1) if state is not ReceiptState.PENDING else None
    conn.execute(receipts.insert().values(
        scope_id=scope_id, event_id=event_id, event_type="demo.credit", state=state.code,
        attempts=n_attempts, accepted_at=accepted_at, completed_at=done, body_sha256=digest,
        result_ref="credit:1" if state is ReceiptState.COMPLETE else None))
    if job is not None:
        conn.execute(jobs.insert().values(
            scope_id=scope_id, event_id=event_id, event_type="demo.credit",
            accepted_at=accepted_at, run_at=run_at or accepted_at, status=job.value,
            attempts=n_attempts, lease_token=n_attempts, payload=payload,
            leased_by="w1" if leased_until else None, leased_until=leased_until))
    for number in range(1, n_attempts + 1):
        conn.execute(attempts.insert().values(
            scope_id=scope_id, event_id=event_id, number=number, worker_id="w1",
            lease_token=number, started_at=accepted_at, finished_at=accepted_at,
            outcome="error" if state is ReceiptState.FAILED else "ok",
            error="RuntimeError: boom" if state is ReceiptState.FAILED else None))
    if state is ReceiptState.FAILED:
        record_failure(conn, scope_id=scope_id, event_id=event_id, event_type="demo.credit",
                       error="RuntimeError: boom", failed_at=accepted_at + timedelta(seconds=1))
    if unsigned:
        conn.execute(unsigned_bodies.insert().values(
            scope_id=scope_id, body_sha256=digest, event_id=event_id, accepted_at=accepted_at))
    if conflict:
        conn.execute(conflicts.insert().values(
            scope_id=scope_id, event_id=event_id, kind="different_body",
            original_event_id=event_id, original_sha256=digest,
            incoming_sha256=hashlib.sha256(b"other").digest(), first_seen=accepted_at,
            last_seen=accepted_at, count=1))
    return digest


def count(conn: Connection, table: str, where: str = "1=1", **params: Any) -> int:
    """Return how many rows of `table` match `where`."""
    return int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE {where}"),
                            params).scalar_one())
