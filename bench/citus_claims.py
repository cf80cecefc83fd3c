"""The worker's claim on a distributed (Citus) ledger: cost per claim with few or many scopes.

    python -m bench.citus_claims --url postgresql+psycopg://…/ledger --scopes 10 1000

The URL names the coordinator of a ledger database already migrated and
distributed (`ledger db upgrade`, `ledger db distribute`). For each scope count
the run adds that many scopes (integration rows) with `--jobs` due jobs spread
evenly over them, then makes `--claims` claims one after another (each its own
transaction, as `ledger worker` makes them: the unlocked read of due keys, the
lock by key, the lease) and reports the time per claim and how many shard tasks
the claim's statements ran. Its rows are deleted afterwards. Not a test: the
README quotes its output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, insert, text

from bench.report import percentile
from ledger.config import Settings
from ledger.db import citus
from ledger.db.engine import make_engine
from ledger.db.schema import attempts, integrations, jobs, receipts
from ledger.worker.store import ClaimLimits, ClaimRequest, claim_next


def _seed(engine: Engine, scopes: int, jobs_total: int, tag: str) -> list[int]:
    """Add `scopes` integrations and `jobs_total` due jobs (with receipts) over them."""
    now = datetime.now(UTC) - timedelta(minutes=5)
    with engine.begin() as conn:
        ids = [int(i) for i in conn.execute(insert(integrations).returning(integrations.c.id),
               [{"public_id": f"in_{tag}_{i}", "account": f"bench-{tag}", "name": f"s{i}",
                 "profile": "stripe", "tolerance_seconds": 300, "created_at": now}
                for i in range(scopes)]).scalars()]
    rows = [(ids[n % scopes], f"{tag}-{n}", now + timedelta(microseconds=n))
            for n in range(jobs_total)]
    with engine.begin() as conn:
        conn.execute(insert(receipts), [
            {"scope_id": s, "event_id": e, "event_type": "bench", "state": 0, "attempts": 0,
             "accepted_at": at, "body_sha256": b"\x00" * 32} for s, e, at in rows])
        conn.execute(insert(jobs), [
            {"scope_id": s, "event_id": e, "event_type": "bench", "accepted_at": at,
             "run_at": at, "status": 0, "attempts": 0, "lease_token": 0, "payload": "{}"}
            for s, e, at in rows])
    return ids


def _cleanup(engine: Engine, ids: list[int]) -> None:
    """Delete what _seed added."""
    with engine.begin() as conn:
        for table in (attempts, jobs, receipts):
            conn.execute(delete(table).where(table.c.scope_id.in_(ids)))
        conn.execute(delete(integrations).where(integrations.c.id.in_(ids)))


def _claims(engine: Engine, count: int) -> list[float]:
    """Make `count` claims, each in its own transaction; return their durations (s)."""
    times = []
    for _ in range(count):
        now = datetime.now(UTC)
        request = ClaimRequest(worker_id="bench", now=now, lease_seconds=600,
                               limits=ClaimLimits(max_attempts=8,
                                                  oldest_window=now - timedelta(days=3)))
        started = time.perf_counter()
        with engine.begin() as conn:
            claimed = claim_next(conn, request)
        times.append(time.perf_counter() - started)
        if claimed is None or claimed[1] is None:
            raise RuntimeError("a claim found no job: seed more jobs than claims")
    return times


def _tasks(engine: Engine) -> dict[str, int]:
    """Return the shard tasks of the claim's two statements (Citus EXPLAIN)."""
    plans = {}
    with engine.connect() as conn:
        for name, sql in (("due_keys", "SELECT scope_id, event_id FROM jobs WHERE status = 0 "
                           "AND run_at <= now() ORDER BY run_at LIMIT 16"),
                          ("lock_by_key", "SELECT * FROM jobs WHERE scope_id = 1 AND "
                           "event_id = 'x' AND status = 0 AND run_at <= now() "
                           "FOR UPDATE SKIP LOCKED")):
            plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql)))
            plans[name] = int(plan.split("Task Count: ")[1].split()[0])
    return plans


def run(url: str, scope_counts: list[int], jobs_total: int, claims: int) -> dict[str, Any]:
    """Measure the claim for each scope count; return the figures."""
    engine = make_engine(Settings(database_url=url), pool_size=1)
    try:
        if not citus.distributed(engine):
            raise SystemExit("the database is not distributed: run `ledger db distribute`")
        out: dict[str, Any] = {"jobs": jobs_total, "claims": claims, "tasks": _tasks(engine),
                               "by_scopes": {}}
        for run_number, scopes in enumerate(scope_counts):
            ids = _seed(engine, scopes, jobs_total, uuid.uuid4().hex[:6])
            try:
                _claims(engine, 20)  # warm the connection and the plans
                times = _claims(engine, claims)
            finally:
                _cleanup(engine, ids)
            out["by_scopes"][f"{run_number + 1}: {scopes} scopes"] = {
                "mean_ms": round(statistics.fmean(times) * 1000, 2),
                "p50_ms": round(statistics.median(times) * 1000, 2),
                "p95_ms": round(percentile(times, 95) * 1000, 2),
                "claims_per_s": round(len(times) / sum(times), 1)}
        return out
    finally:
        engine.dispose()


def main() -> None:
    """Parse the arguments, measure, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--scopes", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--claims", type=int, default=500)
    args = parser.parse_args()
    print(json.dumps(run(args.url, args.scopes, args.jobs, args.claims), indent=2))


if __name__ == "__main__":
    main()
