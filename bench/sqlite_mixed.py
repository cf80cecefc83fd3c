"""SQLite: the intake while one worker drains, with no worker and at two batch sizes.

Not in `make bench` (`python -m bench.run --only sqlite-worker`). On SQLite a
worker's batch holds the one writer (`BEGIN IMMEDIATE`) for all its jobs, so a
bigger batch could make the intake's commits wait longer. One ledger under
gunicorn on one SQLite file with a demo.credit backlog; the sides run
none, A, B, B, A, none (twice), each with fresh signed events and its own
`ledger worker --batch N` process, started and working before the load begins.
"""

from __future__ import annotations

import os
import subprocess
import time
from statistics import mean
from typing import Any

from sqlalchemy import create_engine, text

from bench import env as benv
from bench import worker_bench
from bench.intake import Run, Target, accepted_per_s, load_run, ours_app, signed_files

ORDER = ("none", "a", "b", "b", "a", "none") * 2


def _done(url: str) -> int:
    """Return how many receipts are complete."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM receipts WHERE state = 1")).scalar_one())
    finally:
        engine.dispose()


def _start_worker(e: benv.BenchEnv, url: str, batch: int, log: Any) -> subprocess.Popen:
    """Start `ledger worker --batch N`; return once it has completed 50 jobs."""
    started = _done(url)
    proc = subprocess.Popen([str(benv.BIN / "ledger"), "worker", f"--batch={batch}"],
                            cwd=str(benv.ROOT), env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                     **e.app_env(url)},
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while _done(url) < started + 50:
        if proc.poll() is not None or time.monotonic() > deadline:
            benv.stop(proc)
            raise RuntimeError("the worker did not start working (see sqlite-worker.log)")
        time.sleep(0.1)
    return proc


def measure(e: benv.BenchEnv, shape: benv.ServerShape, seconds: float, batch: int,
            other_batch: int, jobs_count: int = 20_000) -> dict[str, Any]:
    """Return the intake's accepted/s and p99 and the worker's completions/s per side."""
    url = e.sqlite_url("mixed")
    public_id = ours_app(e, url)
    worker_bench.backlog(e, url, jobs_count)
    sizes = {"a": batch, "b": other_batch}
    each = max(seconds / 2, 3)
    runs: dict[str, list[Run]] = {side: [] for side in ("none", "a", "b")}
    completed: dict[str, list[float]] = {"a": [], "b": []}
    log_path = e.tmp / "sqlite-worker.log"
    with benv.gunicorn("app:create_app()", e.app_env(url), shape, cwd=benv.ROOT,
                       log=log_path) as (base, server), open(log_path, "ab") as log:
        target = Target(base, url, f"/hooks/{public_id}", server.pid)
        load_run(target, signed_files(e.tmp, "mixed-warm", public_id, 2), 2)
        for i, side in enumerate(ORDER):
            files = signed_files(e.tmp, f"mixed-{i}", public_id, each)
            worker = None if side == "none" else _start_worker(e, url, sizes[side], log)
            try:
                before, t0 = _done(url), time.monotonic()
                runs[side].append(load_run(target, files, each))
                if worker is not None:
                    completed[side].append((_done(url) - before) / (time.monotonic() - t0))
            finally:
                if worker is not None:
                    benv.stop(worker)
    out: dict[str, Any] = {"batch": batch, "other_batch": other_batch,
                           "order": "".join({"none": "A", "a": "B", "b": "C"}[s] for s in ORDER),
                           "runs": {k: [r.to_json() for r in v] for k, v in runs.items()}}
    for side, side_runs in runs.items():
        out[f"{side}_accepted_per_s"] = accepted_per_s(side_runs)
        out[f"{side}_p99_ms"] = mean(r.wrk.p99_ms for r in side_runs)
    for side, rates in completed.items():
        out[f"{side}_completed_per_s"] = mean(rates)
    return out
