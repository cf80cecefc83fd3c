"""Flat costs as the ledger grows: the same measures on ledgers of growing size.

    python -m bench.run --only scale --scale 10m    # 100k, 1M and 10M receipts, 10,000 scopes

The `scopes` integrations are created once and every ledger is a copy of that
database filled by bench/fastload.py (generate_series inside PostgreSQL) with
receipts over the last 7 days. Measured, each figure against the same bench in the same run:
1. intake: our server on the biggest ledger and on the 100k one, loaded by wrk
   in ABBA order (small, big, big, small), committed receipts per second;
2. every dashboard page (bench.dashboard's list) on the biggest ledger: p95;
3. rollups on the biggest ledger: a full count (a first run, or after a pause over
   the purge margin), then a scheduled run a few minutes later, after the intake's
   new receipts and 1,000 completions: wall time, the receipts that changed and those
   of the scopes and the hour it recounted whole;
4. the retention purge of every finished receipt (copy of each ledger from 1M
   up, full speed): wall microseconds per receipt, biggest vs 1M.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench import big, fastload
from bench import env as benv
from bench.intake import Target, accepted_per_s, load_run, ours_app, signed_files
from jobs import rollups
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.access.secrets_box import load_box
from ledger.clock import SystemClock
from ledger.domain import Integration
from ledger.services import ledger_engine

BASELINE = 100_000
PURGE_BASELINE = 1_000_000
COMPLETIONS = 1_000


def parse_scale(value: str) -> int:
    """Return receipts for '10m', '2m', '300k' or a plain number."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([km]?)", value.strip().lower())
    if not match:
        raise ValueError(f"--scale must look like 1m, 10m or 300k, not {value!r}")
    return int(float(match.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2)])


def sizes(receipts: int) -> list[int]:
    """Return the ledger sizes a scale needs: the baselines below it, then itself."""
    return sorted({BASELINE, receipts} | ({PURGE_BASELINE} if receipts > PURGE_BASELINE
                                         else set()))


def scopes_template(e: benv.BenchEnv, scopes: int) -> tuple[str, list[Integration]]:
    """Create a ledger holding only the scopes, once: every size is copied from it."""
    url = e.migrated_pg("scale_scopes")
    settings = e.settings(url)
    engine = ledger_engine(settings)
    try:
        made = fastload.copy_scopes(engine, load_box(settings.master_key, settings.var_dir),
                                    scopes, now=datetime.now(UTC) - fastload.SPAN)
    finally:
        engine.dispose()
    return url, made


def load(e: benv.BenchEnv, receipts: int, template: tuple[str, list[Integration]]
         ) -> dict[str, Any]:
    """Create one ledger; return its URL, what was made, load time and disk use."""
    started = time.perf_counter()
    url = big.copy_ledger(e, template[0], f"scale_{receipts}")
    engine = ledger_engine(e.settings(url).with_(statement_timeout_ms=3_600_000))
    try:
        made = fastload.load_receipts(engine, template[1], receipts, datetime.now(UTC))
        loaded = time.perf_counter() - started
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        with engine.begin() as conn:
            create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                            role="admin", password=big.PASSWORD, now=datetime.now(UTC))
            disk = int(conn.execute(text("SELECT pg_database_size(current_database())"))
                       .scalar_one())
    finally:
        engine.dispose()
    return {"url": url, "made": made, "load_seconds": round(loaded, 1),
            "vacuum_seconds": round(time.perf_counter() - started - loaded, 1),
            "disk_mb": round(disk / 2**20)}


def intake(e: benv.BenchEnv, small: str, large: str,
           seconds: float, cycles: int = 2, each: float | None = None) -> dict[str, Any]:
    """Load our server on the small and the large ledger in ABBA order, `cycles` times,
    `each` seconds a run (default `seconds` / 2, at least 3)."""
    ids = {url: ours_app(e, url) for url in (small, large)}
    runs: dict[str, list[Any]] = {"small": [], "large": []}
    with benv.shipped(e.app_env(small), log=e.tmp / "scale-small.log") as (small_base, _), \
            benv.shipped(e.app_env(large), log=e.tmp / "scale-large.log") as (large_base, _):
        targets = {"small": Target(small_base, small, f"/hooks/{ids[small]}"),
                   "large": Target(large_base, large, f"/hooks/{ids[large]}")}
        each = max(each or seconds / 2, 3)
        for side, target in targets.items():  # warm-up
            load_run(target, signed_files(e.tmp, f"scale-warm-{side}",
                                          target.path.rsplit("/", 1)[1], 2), 2)
        for cycle in range(cycles):
            for n, side in enumerate(("small", "large", "large", "small")):
                target = targets[side]
                files = signed_files(e.tmp, f"scale-{cycle}-{n}",
                                     target.path.rsplit("/", 1)[1], each)
                runs[side].append(load_run(target, files, each))
    per_s = {side: accepted_per_s(rs) for side, rs in runs.items()}
    return {"small_accepted_per_s": per_s["small"], "large_accepted_per_s": per_s["large"],
            "runs": runs}


def rollup_runs(e: benv.BenchEnv, url: str) -> dict[str, Any]:
    """Time a full recount, then a scheduled run after new receipts and completions."""
    settings = e.settings(url).with_(statement_timeout_ms=3_600_000)
    engine = ledger_engine(settings)
    clock = SystemClock()
    out: dict[str, Any] = {}
    try:
        out["full_recount"] = _timed_counts(engine, full=True)
        started = time.perf_counter()
        with engine.begin() as conn:  # the series' full count (a first run, after a pause)
            rollups.refresh_hourly_series(conn, clock.now(), full=True)
        out["series_full_seconds"] = round(time.perf_counter() - started, 3)
        # The delivery hours' first run too, so that the scheduled run below steps from
        # a previous run of all three rollups, as every run but the first does.
        started = time.perf_counter()
        with engine.begin() as conn:
            rollups.refresh_delivery_hours(conn, clock.now(), full=True)
        out["delivery_full_seconds"] = round(time.perf_counter() - started, 3)
        out["incremental_after_load"] = _timed_counts(engine, full=False)
        return out
    finally:
        engine.dispose()


def scheduled_run(e: benv.BenchEnv, url: str) -> dict[str, Any]:
    """Complete COMPLETIONS pending receipts, then time one scheduled rollups run."""
    settings = e.settings(url).with_(statement_timeout_ms=3_600_000)
    engine = ledger_engine(settings)
    try:
        with engine.begin() as conn:
            completed = conn.execute(text(
                "UPDATE receipts SET state = 1, completed_at = now() WHERE ctid IN ("
                " SELECT ctid FROM receipts WHERE state = 0 LIMIT :n)"),
                {"n": COMPLETIONS}).rowcount
        counts = _timed_counts(engine, full=False)
        started = time.perf_counter()
        with engine.begin() as conn:  # incremental: what changed since the full recount
            series_run = rollups.refresh_hourly_series(conn, SystemClock().now())
            rollups.refresh_delivery_hours(conn, SystemClock().now())
        series = time.perf_counter() - started
    finally:
        engine.dispose()
    return {"completed": completed, "scope_counts": counts,
            "series_recent_seconds": round(series, 3),
            "series_receipts_read": series_run.receipts_read, "series_full": series_run.full,
            "series_repair_read": series_run.repair_read,
            "run_seconds": round(counts["seconds"] + series, 3)}


def _timed_counts(engine: Any, *, full: bool) -> dict[str, Any]:
    """Run refresh_scope_counts once in its own transaction; return time and reads."""
    started = time.perf_counter()
    with engine.begin() as conn:
        run = rollups.refresh_scope_counts(conn, SystemClock().now(), full=full)
    return {"seconds": round(time.perf_counter() - started, 3), "full": run.full,
            "receipts_read": run.receipts_read, "repair_read": run.repair_read,
            "rows_written": run.written}


def purge_cost(e: benv.BenchEnv, url: str, name: str) -> dict[str, Any]:
    """Purge every finished receipt of a copy at full speed; wall us per receipt."""
    copy = big.copy_ledger(e, url, name)
    database = make_url(copy).database
    try:
        result = big.purge_unloaded(e, copy)
    finally:
        with benv.admin_engine().connect() as conn:
            conn.execute(text(f'DROP DATABASE "{database}" WITH (FORCE)'))
        e.databases.remove(str(database))
    result["us_per_receipt"] = round(result["purge_seconds"] / max(
        result["expired_receipts"], 1) * 1e6, 3)
    return result


def measure(e: benv.BenchEnv, receipts: int, scopes: int,
            seconds: float, rounds: int) -> dict[str, Any]:
    """Load every size, then intake, pages, rollups and purge as the module says.

    Each phase's figures go to stderr as it ends, so a run stopped part-way (a 10M
    ledger takes most of an hour here) still says how far it got and at what rate.
    """
    started = time.perf_counter()
    template = scopes_template(e, scopes)
    scopes_seconds = round(time.perf_counter() - started, 1)
    _progress("scopes", {"scopes": scopes, "seconds": scopes_seconds})
    ledgers = {}
    for n in sizes(receipts):
        ledgers[n] = load(e, n, template)
        _progress(f"ledger {n:,}", {k: v for k, v in ledgers[n].items() if k != "made"})
    largest, small = ledgers[receipts], ledgers[BASELINE]
    out: dict[str, Any] = {"receipts": receipts, "scopes": scopes,
                           "scopes_seconds": scopes_seconds,
                           "ledgers": {n: {k: v for k, v in led.items()
                                           if k in ("load_seconds", "vacuum_seconds",
                                                    "disk_mb")}
                                       for n, led in ledgers.items()}}
    # A phase that fails (a rollup killed by the 60 s idle-in-transaction timeout at 10M,
    # a full connection table) is recorded as its error; the other phases still run.
    out["rollups"] = _phase("rollups", lambda: rollup_runs(e, largest["url"]))
    # Two ABBA cycles; at the default 1M of `seconds` / 4 a run (the time of one cycle of
    # `seconds` / 2, which keeps `make bench` under 15 minutes), so that one slow patch of
    # the machine lands on both sides; above it `seconds` / 2 a run.
    each = seconds / 2 if receipts > PURGE_BASELINE else seconds / 4
    out["intake"] = _phase("intake", lambda: intake(e, small["url"], largest["url"],
                                                    seconds, 2, each))
    out["rollups"]["scheduled"] = _phase("rollups scheduled",
                                         lambda: scheduled_run(e, largest["url"]))
    out["dashboard"] = _phase("dashboard", lambda: big.dashboard(e, largest["url"],
                                                                 largest["made"], rounds))
    purged = [n for n in ledgers if n >= PURGE_BASELINE]
    purged = purged if len(purged) >= 2 else list(ledgers)
    out["purge"] = {n: _phase(f"purge {n:,}", lambda n=n: purge_cost(
        e, ledgers[n]["url"], f"scale_purge_{n}")) for n in purged}
    return out


def _phase(name: str, run: Any) -> dict[str, Any]:
    """Run one phase; print its figures, or its error (the run goes on)."""
    try:
        result: dict[str, Any] = run()
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    _progress(name, {k: v for k, v in result.items() if k != "runs"})
    return result


def _progress(phase: str, figures: dict[str, Any]) -> None:
    """Print one phase's figures to stderr with the time and the machine's load."""
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"   scale {datetime.now(UTC):%H:%M:%S} UTC (load {load}) {phase}: "
          f"{json.dumps(figures, default=str)}", file=sys.stderr, flush=True)
