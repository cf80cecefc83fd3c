"""Demo history for `make run`: two days of receipts per demo scope and a dashboard admin.

The intake can only accept events "now"; a dashboard with charts needs the past,
so the demo writes the rows the worker would have left behind (complete receipts,
failed ones with their attempts and retained payload, a few stuck pending ones).
Demo only: nothing else writes receipts outside the intake and the worker.
"""

from __future__ import annotations

import json
import random
import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert

from ledger.access import audit
from ledger.access.operators import create_operator, get_operator
from ledger.db.schema import attempts, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.errors import NotFound
from ledger.worker.failure_groups import record_failure

HOURS = 47
DEMO_ADMIN = "admin"
DEMO_ERRORS = (
    "RuntimeError: demo.fail always raises",
    "TimeoutError: ledger-downstream did not answer within 5.0 s",
    "KeyError: 'amount' missing from data",
)


def seed_admin(conn: Connection, now: datetime, password: str | None = None) -> str | None:
    """Create the demo admin once (LEDGER_DEMO_ADMIN_PASSWORD, or a random password);
    return its password when it was just created."""
    try:
        get_operator(conn, DEMO_ADMIN)
        return None
    except NotFound:
        pass
    password = password or secrets.token_urlsafe(12)
    create_operator(conn, audit.Actor(name="demo-seed", role="cli"), username=DEMO_ADMIN,
                    role="admin", password=password, now=now)
    return password


def seed_history(conn: Connection, scope_ids: list[int], now: datetime,
                 rng: random.Random | None = None) -> int:
    """Write two days of hourly traffic per scope; return how many receipts."""
    rng = rng or random.Random(42)
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for scope_id in scope_ids:
        for hours_ago in range(HOURS, 0, -1):
            start = now - timedelta(hours=hours_ago)
            for i in range(rng.randint(15, 45) + (20 if 8 < hours_ago < 14 else 0)):
                row = _receipt(scope_id, f"evt_h{hours_ago:02d}_{i:03d}", rng,
                               start + timedelta(seconds=rng.randint(0, 3599)), now)
                rows.append(row)
                if row["state"] == ReceiptState.FAILED.code:
                    failed.append(row)
        for n in range(2):  # accepted two hours ago and never claimed: stuck work
            stuck = _receipt(scope_id, f"evt_stuck_{n}", rng,
                             now - timedelta(hours=2, minutes=n), now)
            stuck.update(state=ReceiptState.PENDING.code, attempts=0, completed_at=None,
                         result_ref=None)
            rows.append(stuck)
            conn.execute(insert(jobs).values(**_job(stuck, JobStatus.QUEUED, now)))
    conn.execute(insert(receipts), rows)
    for row in failed:
        conn.execute(insert(jobs).values(**_job(row, JobStatus.FAILED, now)))
        history = _attempts(row, rng)
        conn.execute(insert(attempts), history)
        record_failure(conn, scope_id=row["scope_id"], event_id=row["event_id"],
                       event_type=row["event_type"], error=history[-1]["error"],
                       failed_at=row["completed_at"])
    return len(rows)


def _receipt(scope_id: int, event_id: str, rng: random.Random, accepted_at: datetime,
             now: datetime) -> dict[str, Any]:
    """Return one receipt row: mostly complete, about 4 % failed."""
    is_failed = rng.random() < 0.04
    return {"scope_id": scope_id, "event_id": event_id,
            "event_type": rng.choice(("demo.credit", "demo.credit", "demo.flaky", "demo.fail")
                                     if is_failed else ("demo.credit", "demo.flaky")),
            "state": (ReceiptState.FAILED if is_failed else ReceiptState.COMPLETE).code,
            "attempts": 8 if is_failed else rng.choice((1, 1, 1, 2)),
            "accepted_at": accepted_at,
            "completed_at": min(now, accepted_at + timedelta(seconds=rng.randint(1, 900))),
            "body_sha256": rng.randbytes(32),
            "result_ref": None if is_failed else f"credit:{rng.randint(1, 99999)}"}


def _job(row: dict[str, Any], status: JobStatus, now: datetime) -> dict[str, Any]:
    """Return the work item kept for a failed or pending receipt (payload retained)."""
    payload = json.dumps({"id": row["event_id"], "type": row["event_type"],
                          "data": {"amount": 100, "fail_times": 1, "note": "demo history"}})
    return {"scope_id": row["scope_id"], "event_id": row["event_id"],
            "event_type": row["event_type"], "accepted_at": row["accepted_at"],
            "run_at": row["accepted_at"] if status is JobStatus.QUEUED else now,
            "status": status.value, "attempts": row["attempts"], "lease_token": 0,
            "payload": payload}


def _attempts(row: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """Return the attempt history of a failed receipt, with growing backoff."""
    error = rng.choice(DEMO_ERRORS)
    started = row["accepted_at"]
    history = []
    for number in range(1, row["attempts"] + 1):
        history.append({"scope_id": row["scope_id"], "event_id": row["event_id"],
                        "number": number, "worker_id": f"worker-{rng.randint(1, 3)}",
                        "lease_token": number, "started_at": started,
                        "finished_at": started + timedelta(milliseconds=rng.randint(5, 900)),
                        "outcome": "failed" if number == row["attempts"] else "retry",
                        "error": error})
        started += timedelta(seconds=min(10 * 2 ** number, 3600) * rng.random() + 1)
    return history
