"""Worker measure: demo.credit completions/s, 4 ledger workers vs 4 raw claim loops.

Each side gets its own copy of the same backlog (pending receipts with queued
demo.credit jobs over 100 scopes) and four processes. Completions are counted
from the jobs table after a warm-up, over a fixed window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench import env as benv
from bench.datagen import copy_rows, create_scopes, event_id
from ledger.db import make_engine
from ledger.secrets_box import load_box

PROCESSES = 4
SCOPES = 100


def backlog(e: benv.BenchEnv, url: str, jobs_count: int) -> None:
    """Load `jobs_count` pending demo.credit receipts with their queued jobs."""
    import random

    settings = e.settings(url)
    engine = make_engine(settings)
    rng = random.Random(4)
    try:
        scopes = create_scopes(engine, load_box(settings.master_key, settings.var_dir), SCOPES,
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
                           log: Any, warmup: float, seconds: float) -> dict[str, float]:
    """Start the processes, wait out the warm-up, count completions over `seconds`."""
    procs = [subprocess.Popen(cmd, cwd=str(benv.ROOT), env=env, stdout=subprocess.DEVNULL,
                              stderr=log, start_new_session=True) for cmd in commands]
    try:
        time.sleep(warmup)
        before, t0, cpu0 = jobs_left(url), time.monotonic(), _cpu_seconds(procs)
        time.sleep(seconds)
        after, t1, cpu1 = jobs_left(url), time.monotonic(), _cpu_seconds(procs)
        if after == 0:
            raise RuntimeError("the backlog ran out during the window: raise jobs_count")
        done = max(before - after, 1)
        return {"per_s": done / (t1 - t0), "client_cpu_ms_per_job": 1000 * (cpu1 - cpu0) / done}
    finally:
        for proc in procs:
            benv.stop(proc)


def measure(e: benv.BenchEnv, seconds: float, jobs_count: int = 60_000) -> dict[str, Any]:
    """Return completions/s of the raw loop and of the ledger's workers."""
    raw_url, ours_url = e.migrated_pg("work_raw"), e.migrated_pg("work_ours")
    for url in (raw_url, ours_url):
        backlog(e, url, jobs_count)
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(e.tmp / "workers.log", "ab") as log:
        raw = completions(
            raw_url, [[sys.executable, "-m", "bench.raw_claim", raw_url.replace("+psycopg", "")]]
            * PROCESSES, base_env, log, 2, seconds)
        ours = completions(
            ours_url, [[str(benv.BIN / "ledger"), "worker"]] * PROCESSES,
            {**base_env, **e.app_env(ours_url)}, log, 4, seconds)
    return {"raw_per_s": raw["per_s"], "ours_per_s": ours["per_s"], "processes": PROCESSES,
            "raw_cpu_ms_per_job": raw["client_cpu_ms_per_job"],
            "ours_cpu_ms_per_job": ours["client_cpu_ms_per_job"]}


def _cpu_seconds(procs: list[subprocess.Popen]) -> float:
    """Return the user + system CPU seconds the processes used so far."""
    total = 0.0
    for proc in procs:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
