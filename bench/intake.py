"""Intake measures: accepted/s, p99, duplicates/s, SQLite default, memory per web process.

The ledger and the thin baseline run side by side under the same gunicorn shape
and are loaded in ABBA order (thin, ours, ours, thin), so a slow patch on this
shared machine hits both. Accepted/s counts committed receipts, not responses.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from contextlib import AbstractContextManager, ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench import cpu
from bench import env as benv
from bench.loadgen import WrkResult, presign, run_wrk
from bench.schemas import create_thin_pg, create_thin_sqlite
from ledger.access.secrets_box import load_box
from ledger.config import WEB_THREADS, WebServerSettings
from ledger.services import ledger_engine

THREADS = 2
CONNECTIONS = 16
MAX_RATE = 3000  # requests/s a run may reach before its file of new events wraps
# The ledger's SQLite writer histograms (ledger.metrics), read from its /metrics around a run.
WRITER_METRICS = ("ledger_sqlite_writer_held_seconds", "ledger_sqlite_writer_wait_seconds",
                  "ledger_sqlite_claims_per_commit")


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One load run: what wrk saw and how many receipts were committed."""

    wrk: WrkResult
    accepted: int
    cpu: cpu.CpuUse | None = None
    writer: dict[str, float] | None = None  # the SQLite writer's histograms over the run

    @property
    def accepted_per_second(self) -> float:
        """Return committed receipts per second."""
        return self.accepted / self.wrk.seconds

    def to_json(self) -> dict[str, Any]:
        """Return the run for latest.json."""
        return {"requests": self.wrk.requests, "seconds": round(self.wrk.seconds, 2),
                "accepted": self.accepted, "p50_ms": self.wrk.p50_ms, "p99_ms": self.wrk.p99_ms,
                "errors": self.wrk.errors, "non_2xx": self.wrk.status_errors,
                "wraps": self.wrk.wraps,
                "cpu": self.cpu.per_request_ms(self.wrk.requests) if self.cpu else None,
                "writer": self.writer}


@dataclass(slots=True)
class Target:
    """A server under load and how to count its receipts."""

    base: str
    db_url: str
    path: str
    pid: int | None = None  # the server's master: its CPU is measured during each run
    writer: bool = False  # a ledger on SQLite: read its writer's metrics around each run

    def receipts(self) -> int:
        """Return how many receipts the database holds."""
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return int(conn.execute(text("SELECT count(*) FROM receipts")).scalar_one())
        finally:
            engine.dispose()


def accepted_per_s(runs: list[Run]) -> float:
    """Return the receipts committed per second over several runs taken together."""
    return sum(r.accepted for r in runs) / sum(r.wrk.seconds for r in runs)


def writer_sample(base: str) -> dict[str, float]:
    """Return the sums and counts of the SQLite writer's histograms on a ledger's /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:  # loopback
        page = response.read().decode()
    return {sample.name: sample.value
            for family in text_string_to_metric_families(page) if family.name in WRITER_METRICS
            for sample in family.samples if sample.name.endswith(("_sum", "_count"))}


def writer_summary(runs: list[Run]) -> dict[str, float] | None:
    """Return the one writer's busy share, turns, hold, wait and claims per commit over `runs`.

    The turns are exclusive, so their summed hold over the load time is the share of
    it the writer was busy (each process's turns add up in the multiprocess metrics).
    """
    measured = [r for r in runs if r.writer]
    if not measured:
        return None

    def total(name: str) -> float:
        return sum((r.writer or {}).get(name, 0.0) for r in measured)

    def per(numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator else 0.0

    seconds = sum(r.wrk.seconds for r in measured)
    held, turns = (total("ledger_sqlite_writer_held_seconds_sum"),
                   total("ledger_sqlite_writer_held_seconds_count"))
    return {"busy_share": held / seconds, "turns_per_s": turns / seconds,
            "hold_ms": 1000 * per(held, turns),
            "wait_ms": 1000 * per(total("ledger_sqlite_writer_wait_seconds_sum"),
                                  total("ledger_sqlite_writer_wait_seconds_count")),
            "claims_per_commit": per(total("ledger_sqlite_claims_per_commit_sum"),
                                     total("ledger_sqlite_claims_per_commit_count"))}


def load_run(target: Target, files: Path, seconds: float, limits: str | None = None) -> Run:
    """Replay `files` at `target` for `seconds`; count what was committed."""
    before = target.receipts()
    writer = writer_sample(target.base) if target.writer else None
    with cpu.measured(target.pid) as use:
        result = run_wrk(target.base + target.path, files, seconds=seconds,
                         connections=CONNECTIONS, threads=THREADS, limits=limits)
    if writer is not None:
        after = writer_sample(target.base)
        writer = {name: value - writer.get(name, 0.0) for name, value in after.items()}
    return Run(wrk=result, accepted=target.receipts() - before, cpu=use, writer=writer)


def signed_files(tmp: Path, tag: str, public_id: str, seconds: float) -> Path:
    """Pre-sign enough new events for one run of `seconds` at up to MAX_RATE."""
    prefix = tmp / f"load-{tag}"
    per_thread = int(MAX_RATE * seconds / THREADS) + 500
    presign(prefix, path=f"/hooks/{public_id}", secret=benv.SECRET, per_thread=per_thread,
            threads=THREADS, tag=tag)
    return prefix


def thin_env(url: str) -> dict[str, str]:
    """Return the environment of a baseline server (thin, floor) on the database `url`."""
    return {"THIN_DATABASE_URL": url.replace("+psycopg", ""), "THIN_SECRET": benv.SECRET}


def ours_app(e: benv.BenchEnv, url: str) -> str:
    """Prepare the ledger's database on `url`; return the bench integration's public id."""
    settings = e.settings(url)
    engine = ledger_engine(settings)
    try:
        return benv.bench_integration(engine, load_box(settings.master_key, settings.var_dir))
    finally:
        engine.dispose()


def started(stack: ExitStack, servers: dict[str, AbstractContextManager[Any]],
            urls: dict[str, str], path: str) -> dict[str, Target]:
    """Start each server in `stack` (stopped when it closes); return each as a Target."""
    sides = {}
    for name, server in servers.items():
        base, process = stack.enter_context(server)
        sides[name] = Target(base, urls[name], path, process.pid)
    return sides


def abba(e: benv.BenchEnv, sides: dict[str, Target], seconds: float, tag: str,
         cycles: int = 2) -> dict[str, Any]:
    """Load every side in order, then in reverse (`cycles` times), with fresh events each run.

    Each side runs 2 * cycles times for seconds / cycles: the same load time as two long
    runs, interleaved finely enough that a slow patch on this shared machine lands on
    every side. The sides share one integration's public id (the path of "ours").
    """
    public_id = sides["ours"].path.rsplit("/", 1)[1]
    each = max(seconds / cycles, 3)
    warm = signed_files(e.tmp, f"{tag}-warm", public_id, 2)
    for target in sides.values():
        load_run(target, warm, 2)
    runs: dict[str, Any] = {name: [] for name in sides}
    order = list(sides)
    for cycle in range(cycles):
        a = signed_files(e.tmp, f"{tag}-{cycle}a", public_id, each)
        b = signed_files(e.tmp, f"{tag}-{cycle}b", public_id, each)
        for name, files in [(name, a) for name in order] + [(n, b) for n in reversed(order)]:
            runs[name].append(load_run(sides[name], files, each))
            if name == "ours":
                runs.setdefault("files", []).append(files)
    return runs


def duplicates(e: benv.BenchEnv, ours: Target, runs: dict[str, Any], seconds: float,
               cycles: int = 2) -> dict[str, Any]:
    """Replay ours' runs as duplicates, interleaved with new events (D, N, N, D per cycle).

    A duplicate run replays exactly what one of ours' ABBA runs sent (same
    requests, same count per wrk thread), so every answer is a duplicate; the
    new-event runs next to it are the baseline, measured in the same minutes.
    """
    public_id = ours.path.rsplit("/", 1)[1]
    each = max(seconds / cycles, 3)
    sent = list(zip(runs["files"], runs["ours"], strict=True))  # [a0, b0, a1, b1]
    dup_runs: list[Run] = []
    new_runs: list[Run] = []
    for cycle in range(cycles):
        first, second = sent[2 * cycle % len(sent)], sent[(2 * cycle + 1) % len(sent)]
        dup_runs.append(load_run(ours, first[0], each, limits=first[1].wrk.sent_per_thread))
        for half in ("a", "b"):
            new_runs.append(load_run(ours, signed_files(e.tmp, f"dup-{cycle}{half}",
                                                        public_id, each), each))
        dup_runs.append(load_run(ours, second[0], each, limits=second[1].wrk.sent_per_thread))
    dup_seconds = sum(r.wrk.seconds for r in dup_runs)
    return {"dup_per_s": sum(r.wrk.requests for r in dup_runs) / dup_seconds,
            "dup_new_receipts": sum(r.accepted for r in dup_runs),
            "new_accepted_per_s": accepted_per_s(new_runs),
            "runs": {"duplicates": [r.to_json() for r in dup_runs],
                     "new": [r.to_json() for r in new_runs]}}


def measure_pg(e: benv.BenchEnv, seconds: float,
               overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The ledger as shipped vs the thin intake as written (`gunicorn -w N`), the thin intake
    in the ledger's shape and the gunicorn floor, in that shape and served sync as the thin
    intake is, on PostgreSQL; then duplicates/s."""
    baselines = ("thin", "thin_shaped", "floor", "floor_sync")
    urls = {"ours": e.migrated_pg("intake")} | {name: e.pg_url(name) for name in baselines}
    web = WebServerSettings.from_env({"DATABASE_URL": urls["ours"]} | (overrides or {}))
    shape = benv.ServerShape(workers=web.workers, threads=web.threads)
    sync = benv.ServerShape(workers=web.workers, worker_class="sync", threads=1)
    for name in baselines:
        create_thin_pg(urls[name])
    path = f"/hooks/{ours_app(e, urls['ours'])}"
    log = e.tmp / "intake-pg.log"
    with ExitStack() as stack:
        servers = {
            "thin": benv.thin_as_written(thin_env(urls["thin"]), web.workers, log=log),
            "ours": benv.shipped(e.app_env(urls["ours"]) | (overrides or {}), log=log),
            "thin_shaped": benv.thin_gunicorn(thin_env(urls["thin_shaped"]), shape, log=log),
            "floor": benv.gunicorn("bench.floor_intake:app", thin_env(urls["floor"]), shape,
                                   cwd=benv.ROOT, log=log),
            # The floor as the thin intake is served: what no ledger code could go below.
            "floor_sync": benv.gunicorn("bench.floor_intake:app", thin_env(urls["floor_sync"]),
                                        sync, cwd=benv.ROOT, log=log)}
        sides = started(stack, servers, urls, path)
        runs = abba(e, sides, seconds, "pg")
        dup = duplicates(e, sides["ours"], runs, seconds)
    return summarize(runs) | {"duplicates": dup, "workers": web.workers,
                              "threads": web.threads}


def measure_sqlite(e: benv.BenchEnv, seconds: float) -> dict[str, Any]:
    """The ledger as shipped on its SQLite default vs the thin intake as written on SQLite,
    and beside them the same ledger with PostgreSQL's default threads per process (a copy of
    its database): what SQLite's own default of threads is measured against."""
    ours_url = e.sqlite_url("intake")
    thin_path = e.tmp / "thin.sqlite3"
    create_thin_sqlite(str(thin_path))
    public_id = ours_app(e, ours_url)
    fewer_url = e.sqlite_url("intake_fewer_threads")
    with closing(sqlite3.connect(make_url(ours_url).database or "")) as source, \
            closing(sqlite3.connect(make_url(fewer_url).database or "")) as copy:
        source.backup(copy)
    log = e.tmp / "intake-sqlite.log"
    web = WebServerSettings.from_env({"DATABASE_URL": ours_url})
    fewer = {"LEDGER_WEB_THREADS": str(WEB_THREADS)}
    with benv.thin_as_written(thin_env(f"sqlite:///{thin_path}"), web.workers,
                              log=log) as (thin_base, thin_server), \
            benv.shipped(e.app_env(ours_url), log=log) as (ours_base, ours_server), \
            benv.shipped(e.app_env(fewer_url) | fewer, log=log) as (fewer_base, fewer_server):
        path = f"/hooks/{public_id}"
        sides = {"thin": Target(thin_base, f"sqlite:///{thin_path}", path, thin_server.pid),
                 "ours": Target(ours_base, ours_url, path, ours_server.pid, writer=True),
                 "fewer_threads": Target(fewer_base, fewer_url, path, fewer_server.pid,
                                         writer=True)}
        return summarize(abba(e, sides, seconds, "sqlite")) | {
            "threads": web.threads, "fewer_threads": WEB_THREADS}


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
    """Average the two runs of each app."""
    sides = [name for name in ("thin", "ours", "thin_shaped", "floor", "floor_sync",
                               "fewer_threads") if name in runs]
    out: dict[str, Any] = {"runs": {k: [r.to_json() for r in runs[k]] for k in sides}}
    for name in sides:
        out[f"{name}_accepted_per_s"] = accepted_per_s(runs[name])
        out[f"{name}_p99_ms"] = mean(r.wrk.p99_ms for r in runs[name])
        out[f"{name}_wraps"] = sum(r.wrk.wraps for r in runs[name])
        out[f"{name}_errors"] = sum(r.wrk.errors + r.wrk.status_errors for r in runs[name])
        out[f"{name}_cpu"] = cpu.summed([r.cpu for r in runs[name] if r.cpu],
                                        sum(r.wrk.requests for r in runs[name]))
        if (writer := writer_summary(runs[name])) is not None:
            out[f"{name}_writer"] = writer
    return out


# The shapes the sweep tries against the defaults on PostgreSQL: fewer and more processes,
# fewer and more threads (as many as the pool, and more than it), a pool no larger than the
# threads, and workers recycled ten times as often as gunicorn.conf.py's max_requests.
SWEEP = {"2 processes": {"WEB_CONCURRENCY": "2"},
         "3 processes": {"WEB_CONCURRENCY": "3"},
         "threads 5 (= pool)": {"LEDGER_WEB_THREADS": "5"},
         "threads 1": {"LEDGER_WEB_THREADS": "1"},
         "threads 2": {"LEDGER_WEB_THREADS": "2"},
         "threads 8": {"LEDGER_WEB_THREADS": "8"},
         "threads 16": {"LEDGER_WEB_THREADS": "16"},
         "threads 16 + pool 16": {"LEDGER_WEB_THREADS": "16", "LEDGER_DB_POOL_SIZE": "16"},
         "pool 4 (= threads)": {"LEDGER_DB_POOL_SIZE": "4"},
         "6 processes": {"WEB_CONCURRENCY": "6"},
         "recycled every 5000": {"GUNICORN_CMD_ARGS": "--max-requests 5000"},
         "no keep-alive": {"GUNICORN_CMD_ARGS": "--keep-alive 0"},
         # gunicorn's own gthread: each request head read by a thread, not the event loop
         "plain gthread": {"GUNICORN_CMD_ARGS": "--worker-class gthread"},
         # every claim on a pooled connection: no connection of a thread's own
         "claim connections 0": {"LEDGER_DB_CLAIM_CONNECTIONS": "0"}}
# What two of the features around the claim cost: the defaults beside the ledger without them.
FEATURES = {"delivery log off": {"LEDGER_DELIVERY_LOG": "0"},
            "no per-delivery log line": {"LEDGER_LOG_LEVEL": "WARNING"}}


def measure_sweep(e: benv.BenchEnv, seconds: float, shapes: list[str] | None = None,
                  variants: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """Each of `variants` (SWEEP's shapes by default) against the shipped defaults, a pair
    at a time (the database's connections allow two servers at once), each pair loaded in
    ABBA order, both served as shipped on copies of one PostgreSQL ledger."""
    source = e.migrated_pg("sweep")
    path = f"/hooks/{ours_app(e, source)}"  # every side a copy: the same integration
    template = str(make_url(source).database)
    out = {}
    for n, (name, overrides) in enumerate((variants or SWEEP).items()):
        if shapes and name not in shapes:
            continue
        with ExitStack() as stack:
            sides = {}
            for side, env in (("ours", {}), ("other", overrides)):
                url = e.pg_url(f"sweep_{n}_{side}", template=template)
                base, process = stack.enter_context(benv.shipped(
                    e.app_env(url) | env, log=e.tmp / "sweep.log"))
                sides[side] = Target(base, url, path, process.pid)
            runs = abba(e, sides, seconds, f"sweep{n}")
        out[name] = {side: {"accepted_per_s": accepted_per_s(runs[side]),
                            "p99_ms": mean(r.wrk.p99_ms for r in runs[side])}
                     for side in sides} | {"overrides": overrides}
    return out


def async_server(env: dict[str, str], workers: int, *,
                 log: Path) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve the experimental async intake (bench/asgi_intake.py) with `workers` processes."""
    port = benv.free_port()
    return benv.serve([sys.executable, "-m", "bench.asgi_intake", "--bind",
                       f"127.0.0.1:{port}", "--workers", str(workers)], env, cwd=benv.ROOT,
                      log=log, port=port)


def _spread(runs: list[Run], key: str) -> list[float]:
    """Return each run's accepted/s or p99 (ms), for the spread between rounds."""
    if key == "accepted_per_s":
        return [round(r.accepted_per_second, 1) for r in runs]
    return [round(r.wrk.p99_ms, 1) for r in runs]


def sides_summary(runs: dict[str, Any], sides: Iterable[str]) -> dict[str, Any]:
    """Each side's runs, and its accepted/s, mean p99, their spread, errors and CPU."""
    out: dict[str, Any] = {"runs": {k: [r.to_json() for r in runs[k]] for k in sides}}
    for name in sides:
        out[name] = {"accepted_per_s": accepted_per_s(runs[name]),
                     "p99_ms": mean(r.wrk.p99_ms for r in runs[name]),
                     "accepted_per_s_runs": _spread(runs[name], "accepted_per_s"),
                     "p99_ms_runs": _spread(runs[name], "p99_ms"),
                     "errors": sum(r.wrk.errors + r.wrk.status_errors for r in runs[name]),
                     "cpu": cpu.summed([r.cpu for r in runs[name] if r.cpu],
                                       sum(r.wrk.requests for r in runs[name]))}
    return out


def measure_async(e: benv.BenchEnv, seconds: float, rounds: int = 3) -> dict[str, Any]:
    """The async intake vs the ledger as shipped vs the floor vs the thin intake as written,
    on PostgreSQL, in the same run: every side in turn then in reverse, `rounds` times;
    then duplicates/s of the async intake and of the shipped one, each interleaved with
    new events."""
    ours_url = e.migrated_pg("async_ours")
    web = WebServerSettings.from_env({"DATABASE_URL": ours_url})
    shape = benv.ServerShape(workers=web.workers, threads=web.threads)
    path = f"/hooks/{ours_app(e, ours_url)}"
    # The async side gets a copy of the shipped side's ledger: the same integration.
    urls = {"async": e.pg_url("async_async", template=str(make_url(ours_url).database)),
            "ours": ours_url} | {name: e.pg_url(f"async_{name}") for name in ("thin", "floor")}
    for name in ("thin", "floor"):
        create_thin_pg(urls[name])
    log = e.tmp / "intake-async.log"
    with ExitStack() as stack:
        servers = {
            "async": async_server(e.app_env(urls["async"]), web.workers, log=log),
            "ours": benv.shipped(e.app_env(urls["ours"]), log=log),
            "floor": benv.gunicorn("bench.floor_intake:app", thin_env(urls["floor"]), shape,
                                   cwd=benv.ROOT, log=log),
            "thin": benv.thin_as_written(thin_env(urls["thin"]), web.workers, log=log)}
        sides = started(stack, servers, urls, path)
        runs = abba(e, sides, seconds, "async", cycles=rounds)
        # abba keeps the files every side was sent; each side replays its own runs.
        dup = {name: duplicates(e, sides[name], {"files": runs["files"], "ours": runs[name]},
                                seconds, cycles=rounds)
               for name in ("async", "ours")}
    return sides_summary(runs, sides) | {
        "duplicates": dup, "workers": web.workers, "threads": web.threads, "rounds": rounds}


# The memory measure: how far a web process grows over as many requests as it serves between
# two recycles (gunicorn.conf.py's max_requests), recycling off while it is measured.
MEMORY_REQUESTS_PER_PROCESS = 50_000


def _rss_mb(pid: int) -> float:
    """Return a process's resident set size in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for process {pid}")


def _workers(master: int) -> list[int]:
    """Return the pids of a gunicorn master's worker processes."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return sorted(int(pid) for pid in children)


def measure_memory(e: benv.BenchEnv, requests_per_process: int = MEMORY_REQUESTS_PER_PROCESS
                   ) -> dict[str, Any]:
    """Serve the ledger as shipped (recycling off), warm it, note each web process's RSS,
    load it until every process has served about `requests_per_process` new events, note
    the RSS again. The same processes must still be running at the end."""
    url = e.migrated_pg("memory")
    public_id = ours_app(e, url)
    web = WebServerSettings.from_env({"DATABASE_URL": url})
    env = e.app_env(url) | {"GUNICORN_CMD_ARGS": "--max-requests 0"}
    with benv.shipped(env, log=e.tmp / "memory.log") as (base, process):
        target = Target(base, url, f"/hooks/{public_id}", process.pid)
        load_run(target, signed_files(e.tmp, "memory-warm", public_id, 3), 3)
        pids = _workers(process.pid)
        before = {pid: _rss_mb(pid) for pid in pids}
        served = 0
        goal = requests_per_process * web.workers
        round_no = 0
        while served < goal:
            files = signed_files(e.tmp, f"memory-{round_no}", public_id, 20)
            served += load_run(target, files, 20).wrk.requests
            round_no += 1
        if _workers(process.pid) != pids:
            raise RuntimeError("a web process was replaced while memory was measured")
        after = {pid: _rss_mb(pid) for pid in pids}
    return {"requests": served, "processes": len(pids),
            "rss_before_mb": [round(before[p], 1) for p in pids],
            "rss_after_mb": [round(after[p], 1) for p in pids]}
