"""CPU per job of one worker draining a backlog, in-process: client and PostgreSQL backend.

Not part of `make bench`: the evidence behind bench/README.md, "Workers" (issue 15).
One process, nothing concurrent, so the figures hold still on a shared machine
where throughput does not. Each side drains its own copy of one backlog of
demo.credit jobs (bench/worker_bench.backlog):

- `raw`: bench/raw_claim.claim_one in a loop (the hand-written baseline);
- `batch N`: the ledger's `Worker(...).run(burst=True)` with that batch size.

After a warm-up of `--warmup` jobs, `--jobs` jobs are timed: the client's CPU
(`time.process_time`, this process), the PostgreSQL backend's CPU
(/proc/<backend pid>/stat) and the driver's round trips (psycopg executes and
commits, counted by wrapping them). `--profile FILE` also writes a cProfile
of the timed part of the first ledger side (CPU-time clock), to read with
`python -m pstats FILE`. Run:

    python -m bench.worker_profile --sides raw,8,16 --jobs 4000
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

from bench import cpu as cpu_of
from bench import env as benv
from bench import raw_claim
from bench.worker_bench import _backend_pids, backlog
from ledger.worker import batch

COUNTS: Counter[str] = Counter()


@contextmanager
def counted_round_trips() -> Iterator[None]:
    """Count psycopg's executes and commits (each one round trip) while the block runs."""
    originals: dict[str, Callable[..., Any]] = {
        "cursor": psycopg.Cursor.execute, "executemany": psycopg.Cursor.executemany,
        "connection": psycopg.Connection.execute, "commit": psycopg.Connection.commit}

    def wrap(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any, **kwargs: Any) -> Any:
            COUNTS[name] += 1
            return inner(*args, **kwargs)
        return counting

    psycopg.Cursor.execute = wrap("cursor", originals["cursor"])  # type: ignore[method-assign]
    psycopg.Cursor.executemany = wrap(  # type: ignore[method-assign]
        "executemany", originals["executemany"])
    # Connection.execute runs a cursor's execute: counted there, not twice.
    psycopg.Connection.commit = wrap("commit", originals["commit"])  # type: ignore[method-assign]
    # The batch's savepoints go to libpq directly (ledger.worker.batch._execute).
    savepoint = batch._execute
    batch._execute = wrap("savepoint", savepoint)
    try:
        yield
    finally:
        batch._execute = savepoint
        psycopg.Cursor.execute = originals["cursor"]  # type: ignore[method-assign]
        psycopg.Cursor.executemany = originals["executemany"]  # type: ignore[method-assign]
        psycopg.Connection.commit = originals["commit"]  # type: ignore[method-assign]


def backend_cpu(pid: int) -> float:
    """Return the CPU seconds a PostgreSQL backend used so far."""
    return cpu_of.pid_seconds([pid])


def measure_raw(url: str, warmup: int, jobs: int) -> dict[str, float]:
    """Time `jobs` iterations of the raw claim loop after `warmup` of them."""
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        for _ in range(warmup):
            raw_claim.claim_one(conn)
        pid = conn.info.backend_pid
        COUNTS.clear()
        db0, cpu0, t0 = backend_cpu(pid), _rusage(), time.perf_counter()
        with counted_round_trips():
            done = sum(raw_claim.claim_one(conn) for _ in range(jobs))
        db1, cpu1, t1 = backend_cpu(pid), _rusage(), time.perf_counter()
    return _figures(done, (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]), db1 - db0, t1 - t0)


def measure_ledger(e: benv.BenchEnv, url: str, batch: int, warmup: int, jobs: int,
                   profile: str | None) -> dict[str, float]:
    """Time the ledger's worker draining `jobs` jobs (after `warmup`) at `batch`."""
    from ledger.services import build_services
    from ledger.worker.loop import Worker

    settings = e.settings(url).with_(demo_handlers=True, worker_batch=batch)
    services = build_services(settings)
    worker = Worker(services, batch_size=batch)
    worker.run(burst=True, stop=_stop_after(worker, warmup))
    # The timed run drains exactly `jobs` more (the stop is checked per batch).
    stop = _stop_after(worker, jobs)
    pids = _backend_pids(url)  # the pool's connections, kept open since the warm-up
    COUNTS.clear()
    profiler = cProfile.Profile(time.process_time) if profile else None
    db0, cpu0, t0 = _cpu(pids), _rusage(), time.perf_counter()
    with counted_round_trips():
        if profiler is not None:
            profiler.enable()
        done = worker.run(burst=True, stop=stop)
        if profiler is not None:
            profiler.disable()
    db1, cpu1, t1 = _cpu(pids), _rusage(), time.perf_counter()
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
    services.close()
    return _figures(done, (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]), db1 - db0, t1 - t0)


def _stop_after(worker: Any, jobs: int) -> Any:
    """Return a stop event set once the worker has started `jobs` jobs (checked per batch)."""
    import threading

    stop = threading.Event()
    seen = {"n": 0}
    original = worker._start

    def start(*args: Any) -> Any:
        seen["n"] += 1
        if seen["n"] >= jobs:
            stop.set()
        return original(*args)

    worker._start = start
    return stop


def _cpu(pids: list[int]) -> float:
    """Return the CPU seconds the backends `pids` used so far."""
    return sum(backend_cpu(pid) for pid in pids)


def _rusage() -> tuple[float, float]:
    """Return this process's (user, system) CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _figures(done: int, cpu: tuple[float, float], db_cpu: float, seconds: float
             ) -> dict[str, float]:
    """Return the per-job figures of one timed side."""
    done = max(int(done), 1)
    return {"jobs": done, "client_ms": 1000 * sum(cpu) / done,
            "client_user_ms": 1000 * cpu[0] / done, "client_sys_ms": 1000 * cpu[1] / done,
            "db_ms": 1000 * db_cpu / done,
            "jobs_per_s": done / seconds,
            "round_trips_per_job": sum(COUNTS.values()) / done,
            "statements_per_job": COUNTS["cursor"] / done,
            "savepoints_per_job": COUNTS["savepoint"] / done,
            "commits_per_job": COUNTS["commit"] / done}


def main(argv: list[str] | None = None) -> int:
    """Build one backlog, drain a copy per side, print CPU per job."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", default="raw,8")
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=1, help="each side this many times")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--log", default=os.devnull, help="where stderr (the worker's log) goes")
    args = parser.parse_args(argv)
    # The worker's INFO lines go where the bench sends them, to a file, not a terminal.
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 2)
    with tempfile.TemporaryDirectory(prefix="ledger-wprof-") as tmp:
        e = benv.BenchEnv(tmp=Path(tmp))
        try:
            source = e.migrated_pg("wprof_backlog")
            backlog(e, source, (args.jobs + args.warmup) + 500)
            template = make_url(source).database
            profile = args.profile
            for run in range(args.repeat):
                for place, side in enumerate(args.sides.split(",")):
                    url = e.pg_url(f"wprof_{run}_{place}_{side}", template=template)
                    if side == "raw":
                        figures = measure_raw(url, args.warmup, args.jobs)
                    else:
                        figures = measure_ledger(e, url, int(side), args.warmup, args.jobs,
                                                 profile)
                        profile = None
                    print(f"{side:>4}: " + ", ".join(
                        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in figures.items()), file=sys.stdout, flush=True)
        finally:
            e.drop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
