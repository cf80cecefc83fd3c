"""Benchmark the scheduled jobs on PostgreSQL: a 1M-row purge under intake load, rollup cost.

    .venv/bin/python -m bench.scheduled_jobs [--rows 1000000] [--rollup-rows 200000]

Creates `ledger_bench_sched_<random>` on LEDGER_BENCH_PG_URL (default the local
server), drops it afterwards. Intake load is the intake's own claim transaction
(claim_receipt + enqueue_job, no HTTP) from 2 threads, so the figures isolate
what the purge does to the database path. Results go to stdout as JSON lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.report import percentile
from jobs import rollups
from jobs.retention import purge
from ledger.clock import SystemClock
from ledger.config import Settings
from ledger.db.engine import upgrade
from ledger.intake.store import NewEvent, claim_receipt, enqueue_job
from ledger.services import ledger_engine

PG_ADMIN_URL = os.environ.get("LEDGER_BENCH_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _load(engine: Any, rows: int, old: datetime, scopes: int = 20) -> None:
    """Insert `rows` complete receipts (one attempt each) accepted before `old`, in time order."""
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL statement_timeout = 0"))
        conn.execute(text("""
            INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts,
                                  event_id, event_type, body_sha256, result_ref)
            SELECT :old - (:n - i) * interval '500 ms', :old, 1 + i % :scopes,
                   CASE WHEN i % 100 = 0 THEN 2 ELSE 1 END, 1,
                   'evt_' || md5(i::text), 'invoice.paid', sha256(i::text::bytea), 'credit:1'
            FROM generate_series(1, :n) AS i"""), {"old": old, "n": rows, "scopes": scopes})
        conn.execute(text("""
            INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token,
                                  started_at, finished_at, outcome)
            SELECT 1 + i % :scopes, 'evt_' || md5(i::text), 1, 'w', 1, :old, :old, 'ok'
            FROM generate_series(1, :n) AS i"""), {"old": old, "n": rows, "scopes": scopes})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("SET statement_timeout = 0"))
        conn.execute(text("VACUUM ANALYZE receipts"))
        conn.execute(text("VACUUM ANALYZE attempts"))


def _intake_load(engine: Any, stop: threading.Event, latencies: list[float]) -> None:
    """Claim fresh events back to back until `stop`, recording each transaction's time."""
    payload = json.dumps({"type": "invoice.paid", "data": {"amount": 1}})
    while not stop.is_set():
        event_id = f"live_{uuid.uuid4().hex}"
        event = NewEvent(scope_id=1, event_id=event_id, event_type="invoice.paid",
                         body_sha256=hashlib.sha256(event_id.encode()).digest(),
                         payload=payload, accepted_at=datetime.now(UTC))
        started = time.perf_counter()
        with engine.begin() as conn:
            claim_receipt(conn, event)
            enqueue_job(conn, event)
        latencies.append(time.perf_counter() - started)


def _measure_intake(engine: Any, seconds: float | None, during: Any = None) -> dict[str, Any]:
    """Run the intake load for `seconds` (or while `during()` runs); return its figures."""
    stop = threading.Event()
    lat: list[list[float]] = [[], []]
    threads = [threading.Thread(target=_intake_load, args=(engine, stop, lat[i]))
               for i in range(2)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    result = None
    if during:
        result = during()
    else:
        time.sleep(seconds or 0)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    every = sorted(lat[0] + lat[1])
    return {"intake_tps": round(len(every) / elapsed), "intake_p50_ms":
            round(statistics.median(every) * 1000, 2),
            "intake_p99_ms": round(percentile(every, 99) * 1000, 2),
            "intake_max_ms": round(every[-1] * 1000, 2), "result": result,
            "seconds": round(elapsed, 2)}


def bench_purge(url: str, rows: int) -> dict[str, Any]:
    """Purge `rows` expired receipts while the intake runs; compare with the intake alone."""
    settings = Settings(database_url=url, master_key="x", pool_size=4,
                        statement_timeout_ms=60_000)
    engine = ledger_engine(settings)
    old = datetime.now(UTC) - timedelta(seconds=settings.retention_seconds + 3600)
    _load(engine, rows, old)
    baseline = _measure_intake(engine, 5)
    batches: list[float] = []
    last = [time.perf_counter()]

    def on_batch(_total: int) -> None:
        now = time.perf_counter()
        batches.append(now - last[0])
        last[0] = now

    def run_purge() -> dict[str, Any]:
        started = time.perf_counter()
        result = purge(engine, settings, SystemClock(), on_batch=on_batch)
        took = time.perf_counter() - started
        return {"expired": result.expired_receipts, "purge_seconds": round(took, 2),
                "purge_rows_per_s": round(result.expired_receipts / took),
                "batch_max_ms": round(max(batches) * 1000, 1),
                "batch_median_ms": round(statistics.median(batches) * 1000, 1)}

    during = _measure_intake(engine, None, during=run_purge)
    engine.dispose()
    return {"bench": "purge", "rows": rows, "baseline": baseline, "during_purge": during}


def bench_rollups(url: str, rows: int) -> dict[str, Any]:
    """Time the scope_counts and hourly_series refresh on `rows` receipts (recent ones)."""
    settings = Settings(database_url=url, master_key="x", statement_timeout_ms=60_000)
    engine = ledger_engine(settings)
    _load(engine, rows, datetime.now(UTC))
    timings: dict[str, Any] = {"bench": "rollups", "rows": rows}
    with engine.begin() as conn:
        plan = conn.execute(text(
            "EXPLAIN SELECT scope_id, count(*) FROM receipts GROUP BY scope_id")).scalars()
        timings["totals_plan"] = [line.strip() for line in plan][:3]
    for name, step in (("scope_counts", rollups.refresh_scope_counts),
                       ("series_full_7d", lambda c, n: rollups.refresh_hourly_series(
                           c, n, full=True)),
                       ("series_incremental", lambda c, n: rollups.refresh_hourly_series(
                           c, n))):
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            with engine.begin() as conn:
                step(conn, datetime.now(UTC))
            samples.append(time.perf_counter() - started)
        timings[f"{name}_ms"] = round(statistics.median(samples) * 1000, 1)
    engine.dispose()
    return timings


def _database() -> tuple[str, Any]:
    """Create and migrate a scratch database; return its URL and the admin engine."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"ledger_bench_sched_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = ledger_engine(Settings(database_url=url, master_key="x"))
    upgrade(engine)
    engine.dispose()
    return url, admin


def main() -> None:
    """Run both benchmarks, each on its own scratch database."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rollup-rows", type=int, nargs="*", default=[200_000, 1_000_000])
    args = parser.parse_args()
    jobs = [(bench_purge, args.rows)] + [(bench_rollups, n) for n in args.rollup_rows]
    for bench, rows in jobs:
        url, admin = _database()
        try:
            print(json.dumps(bench(url, rows)), flush=True)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" '
                                  "WITH (FORCE)"))
            admin.dispose()


if __name__ == "__main__":
    main()
