"""Worker measure: demo.credit completions/s, 4 ledger workers vs 4 raw claim loops.

One backlog (pending receipts with queued demo.credit jobs over 100 scopes) is loaded
once; every run gets its own copy of it (CREATE DATABASE ... TEMPLATE) and four
processes. The sides run in ABBA order twice (raw, ours, ours, raw, raw, ours, ours,
raw), each run over a quarter of `seconds`, so a slow patch of a shared machine lands
on both. Completions are counted from the jobs table once every process is working
(the jobs left dropped by 100 per process: start-up imports stay out of the window and
out of the CPU per job), over a fixed window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, insert, make_url, text

from bench import cpu
from bench import env as benv
from bench.datagen import copy_rows, create_scopes, event_id
from ledger.access.secrets_box import load_box
from ledger.config import DEFAULT_WORKER_BATCH_POSTGRESQL
from ledger.db.schema import jobs, receipts
from ledger.services import ledger_engine

PROCESSES = 4
SCOPES = 100
ORDER = ("raw", "ours", "ours", "raw") * 2  # ABBA, twice


def backlog(e: benv.BenchEnv, url: str, jobs_count: int, scopes_count: int = SCOPES) -> None:
    """Load `jobs_count` pending demo.credit receipts with their queued jobs over the scopes."""
    import random

    settings = e.settings(url)
    engine = ledger_engine(settings)  # with the audit key: creating scopes is audited
    rng = random.Random(4)
    try:
        scopes = create_scopes(engine, load_box(settings.master_key, settings.var_dir),
                               scopes_count,
                               now=datetime.now(UTC), prefix="work")
        start = datetime.now(UTC) - timedelta(minutes=5)
        receipts_rows, job_rows = [], []
        for i in range(jobs_count):
            scope_id, eid = rng.choice(scopes).id, event_id(rng)
            at = start + timedelta(microseconds=i)
            payload = json.dumps({"type": "demo.credit", "id": eid, "data": {"amount": 1}})
            receipts_rows.append({
                "accepted_at": at, "scope_id": scope_id, "state": 0, "attempts": 0,
                "event_id": eid, "event_type": "demo.credit", "body_sha256": rng.randbytes(32)})
            job_rows.append({
                "scope_id": scope_id, "event_id": eid, "event_type": "demo.credit",
                "accepted_at": at, "run_at": at, "status": 0, "attempts": 0, "lease_token": 0,
                "payload": payload})
        with engine.begin() as conn:
            if engine.dialect.name != "postgresql":  # SQLite: no COPY, no VACUUM ANALYZE
                conn.execute(insert(receipts), receipts_rows)
                conn.execute(insert(jobs), job_rows)
                return
            copy_rows(conn.connection.driver_connection, "receipts", receipts_rows)
            copy_rows(conn.connection.driver_connection, "jobs", job_rows)
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE receipts, jobs")
    finally:
        engine.dispose()


def jobs_left(url: str) -> int:
    """Return how many jobs remain."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM jobs")).scalar_one())
    finally:
        engine.dispose()


def completions(url: str, commands: list[list[str]], env: dict[str, str],
                log: Any, seconds: float) -> dict[str, float]:
    """Start the processes, wait until all work, count completions and CPU over `seconds`.

    CPU: the processes' own, their PostgreSQL backends' (the database's other
    sessions once all work), and the machine's idle share over the window.
    """
    procs = [subprocess.Popen(cmd, cwd=str(benv.ROOT), env=env, stdout=subprocess.DEVNULL,
                              stderr=log, start_new_session=True) for cmd in commands]
    try:
        _wait_until_working(url, procs, started=jobs_left(url))
        backends = _backend_pids(url)
        before, t0, cpu0 = jobs_left(url), time.monotonic(), _cpu_seconds(procs)
        db0, machine0 = cpu.pid_seconds(backends), _machine_ticks()
        time.sleep(seconds)
        after, t1, cpu1 = jobs_left(url), time.monotonic(), _cpu_seconds(procs)
        db1, machine1 = cpu.pid_seconds(backends), _machine_ticks()
        if after == 0:
            raise RuntimeError("the backlog ran out during the window: raise jobs_count")
        total, idle = (b - a for a, b in zip(machine0, machine1, strict=True))
        return {"done": max(before - after, 1), "seconds": t1 - t0, "cpu": cpu1 - cpu0,
                "db_cpu": db1 - db0, "idle": idle / max(total, 1)}
    finally:
        for proc in procs:
            benv.stop(proc)


def _backend_pids(url: str) -> list[int]:
    """Return the pids of the other sessions on the database of `url` (none on SQLite)."""
    if url.startswith("sqlite"):
        return []
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [int(pid) for pid in conn.execute(text(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()")).scalars()]
    finally:
        engine.dispose()


def _machine_ticks() -> tuple[int, int]:
    """Return (all, idle + iowait) CPU ticks of the machine so far (/proc/stat)."""
    ticks = cpu.machine_ticks()
    return ticks.all, ticks.idle


def _wait_until_working(url: str, procs: list[subprocess.Popen], started: int,
                        timeout: float = 60.0) -> None:
    """Return once the processes completed 100 jobs each, plus a second to settle."""
    deadline = time.monotonic() + timeout
    while jobs_left(url) > started - 100 * len(procs):
        if any(proc.poll() is not None for proc in procs):
            raise RuntimeError("a worker process exited during the warm-up (see workers.log)")
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start within a minute (see workers.log)")
        time.sleep(0.2)
    time.sleep(1)


def measure(e: benv.BenchEnv, seconds: float, jobs_count: int = 60_000) -> dict[str, Any]:
    """Return completions/s of the raw loop and of the ledger's workers, ABBA interleaved."""
    ledger = [str(benv.BIN / "ledger"), "worker"]
    source = e.migrated_pg("work_backlog")
    backlog(e, source, jobs_count, SCOPES)
    template = make_url(source).database
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    totals = empty_totals("raw", "ours")
    window = seconds / ORDER.count("raw")  # each side runs `seconds` in all
    with open(e.tmp / "workers.log", "ab") as log:
        for run, side in enumerate(ORDER):
            url = e.pg_url(f"work_{run}_{side}", template=template)
            if side == "raw":
                figures = completions(url, [[sys.executable, "-m", "bench.raw_claim",
                                             url.replace("+psycopg", "")]] * PROCESSES,
                                      base_env, log, window)
            else:
                figures = completions(url, [ledger] * PROCESSES,
                                      {**base_env, **e.app_env(url)}, log, window)
            for key, value in figures.items():
                totals[side][key] += value
    raw, ours = totals["raw"], totals["ours"]
    return {"batch": DEFAULT_WORKER_BATCH_POSTGRESQL, "processes": PROCESSES,
            **{f"{name}_per_s": side["done"] / side["seconds"]
               for name, side in (("raw", raw), ("ours", ours))},
            **{f"{name}_cpu_ms_per_job": 1000 * side["cpu"] / side["done"]
               for name, side in (("raw", raw), ("ours", ours))},
            **{f"{name}_db_cpu_ms_per_job": 1000 * side["db_cpu"] / side["done"]
               for name, side in (("raw", raw), ("ours", ours))}}


def empty_totals(*sides: str) -> dict[str, dict[str, float]]:
    """Return each side's sums of what `completions` measures, all zero."""
    keys = ("done", "seconds", "cpu", "db_cpu", "idle")
    return {side: dict.fromkeys(keys, 0.0) for side in sides}


def _cpu_seconds(procs: list[subprocess.Popen]) -> float:
    """Return the user + system CPU seconds the processes used so far."""
    return cpu.pid_seconds(proc.pid for proc in procs)

