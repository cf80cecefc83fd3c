"""Baseline: the least a durable worker must do, with no framework.

One transaction per job: claim the oldest due job (FOR UPDATE SKIP LOCKED, so
concurrent loops never wait on each other's row), apply demo.credit's effect,
mark the receipt complete, delete the job. Run: python -m bench.raw_claim URL;
it loops until SIGTERM. The ledger's worker does the same work plus leases,
fencing, attempts history and logs (bench/README.md).
"""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType

import psycopg

CLAIM = """
SELECT scope_id, event_id, payload FROM jobs
WHERE status = 0 AND run_at <= now()
ORDER BY run_at
LIMIT 1
FOR UPDATE SKIP LOCKED
"""
CREDIT = """
INSERT INTO demo_balances (scope_id, balance) VALUES (%s, %s)
ON CONFLICT (scope_id) DO UPDATE SET balance = demo_balances.balance + EXCLUDED.balance
RETURNING balance
"""
COMPLETE = """
UPDATE receipts SET state = 1, attempts = attempts + 1, completed_at = now(), result_ref = %s
WHERE scope_id = %s AND event_id = %s
"""
DELETE = "DELETE FROM jobs WHERE scope_id = %s AND event_id = %s"
STOP: list[bool] = []


def claim_one(conn: psycopg.Connection) -> bool:
    """Claim and complete one job in one transaction; False when none is due."""
    with conn.transaction():
        row = conn.execute(CLAIM).fetchone()
        if row is None:
            return False
        scope_id, event_id, payload = row
        amount = json.loads(payload)["data"]["amount"]
        credited = conn.execute(CREDIT, (scope_id, amount)).fetchone()
        assert credited is not None  # an upsert with RETURNING always returns its row
        balance = credited[0]
        conn.execute(COMPLETE, (f"credit:{balance}", scope_id, event_id))
        conn.execute(DELETE, (scope_id, event_id))
    return True


def _stop(_signum: int, _frame: FrameType | None) -> None:
    """Finish the current job, then exit."""
    STOP.append(True)


def main(url: str) -> int:
    """Loop until SIGTERM or no job is due; return how many jobs completed."""
    signal.signal(signal.SIGTERM, _stop)
    done = 0
    with psycopg.connect(url) as conn:
        while not STOP and claim_one(conn):
            done += 1
    return done


if __name__ == "__main__":
    print(main(sys.argv[1]))
