"""Flat costs as the ledger grows: the same measures on ledgers of growing size.

    python -m bench.run --only scale --scale 10m    # 100k, 1M and 10M receipts, 10,000 scopes
    python -m bench.run --only scale --scale 10m --pages-only   # 10M alone, its pages
    ... --pages-only --keep-db NAME    # keep the loaded biggest ledger as database NAME
    ... --pages-only --reuse-db NAME   # time the pages of a kept ledger again, no load

The `scopes` integrations are created once and every ledger is a copy of that
database filled by bench/fastload.py (generate_series inside PostgreSQL) with
receipts over the last 7 days and the tables the pages read (fastload.load_page_tables),
then its rollups refreshed as the scheduler keeps them. Measured:
1. every dashboard page (bench.big's list) on the biggest ledger, above 1M: p95;
2. the retention purge of every finished receipt (a copy of each ledger from 1M up,
   full speed): wall microseconds per receipt, biggest vs the smallest purged.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import sys
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench import big, fastload
from bench import env as benv
from jobs.rollups import refresh
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.access.secrets_box import load_box
from ledger.clock import SystemClock
from ledger.domain import Integration
from ledger.services import ledger_engine

BASELINE = 100_000
PURGE_BASELINE = 1_000_000
KEPT = benv.ROOT / "var" / "bench-kept"  # what a kept ledger's pages need: key, samples


def parse_scale(value: str) -> int:
    """Return receipts for '10m', '2m', '300k' or a plain number."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([km]?)", value.strip().lower())
    if not match:
        raise ValueError(f"--scale must look like 1m, 10m or 300k, not {value!r}")
    return int(float(match.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2)])


def sizes(receipts: int, pages_only: bool = False) -> list[int]:
    """Return the ledger sizes a scale needs: the baselines below it, then itself."""
    if pages_only:
        return [receipts]
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
        end = datetime.now(UTC)
        made = fastload.load_receipts(engine, template[1], receipts, end)
        tables = fastload.load_page_tables(engine, end)
        rollups = time.perf_counter()
        refresh(engine, SystemClock(), full_series=True)  # the rollups the pages read
        loaded = time.perf_counter() - started
        rollups = time.perf_counter() - rollups
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        with engine.begin() as conn:
            create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                            role="admin", password=big.PASSWORD, now=datetime.now(UTC))
            disk = int(conn.execute(text("SELECT pg_database_size(current_database())"))
                       .scalar_one())
    finally:
        engine.dispose()
    return {"url": url, "made": made, "tables": tables, "load_seconds": round(loaded, 1),
            "rollups_seconds": round(rollups, 1),
            "vacuum_seconds": round(time.perf_counter() - started - loaded, 1),
            "disk_mb": round(disk / 2**20)}


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


def keep(e: benv.BenchEnv, ledger: dict[str, Any], name: str) -> dict[str, Any]:
    """Rename a loaded ledger's database to `name`, out of the run's drop list, and save
    what timing its pages again needs under var/: the master key, what was made and the
    run's var dir (its audit key keys the ledger's audit chain)."""
    database = str(make_url(ledger["url"]).database)
    with benv.admin_engine().connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" RENAME TO "{name}"'))
    e.databases.remove(database)
    ledger = ledger | {"url": make_url(ledger["url"]).set(database=name)
                       .render_as_string(hide_password=False)}
    shutil.copytree(e.tmp, KEPT / name, dirs_exist_ok=True)
    (KEPT / f"{name}.pickle").write_bytes(pickle.dumps(
        {"master_key": e.master_key, "ledger": ledger}))
    return ledger


def reuse(e: benv.BenchEnv, name: str) -> dict[str, Any]:
    """Return a ledger kept by `keep`, its master key and var dir made this run's."""
    kept = pickle.loads((KEPT / f"{name}.pickle").read_bytes())
    shutil.copytree(KEPT / name, e.tmp, dirs_exist_ok=True)
    e.master_key = kept["master_key"]
    return dict(kept["ledger"])


def measure(e: benv.BenchEnv, receipts: int, scopes: int, seconds: float, rounds: int,
            pages_only: bool = False, keep_db: str | None = None,
            reuse_db: str | None = None) -> dict[str, Any]:
    """Load every size, then time the pages and the purge as the module says.

    `pages_only` loads the biggest ledger alone and times its pages: no purge, so no
    smaller ledgers (at 10M about an hour here instead of several). `keep_db` keeps that
    ledger as a database of that name after the run; `reuse_db` times the pages of a
    kept one instead of loading (its load figures are those recorded when it was kept).

    Each phase's figures go to stderr as it ends, so a run stopped part-way (a 10M
    ledger takes most of an hour here) still says how far it got and at what rate.
    """
    started = time.perf_counter()
    ledgers = {}
    if reuse_db:
        pages_only, scopes_seconds = True, 0.0
        ledgers[receipts] = reuse(e, reuse_db)
    else:
        template = scopes_template(e, scopes)
        scopes_seconds = round(time.perf_counter() - started, 1)
        _progress("scopes", {"scopes": scopes, "seconds": scopes_seconds})
        for n in sizes(receipts, pages_only):
            ledgers[n] = load(e, n, template)
            _progress(f"ledger {n:,}", {k: v for k, v in ledgers[n].items() if k != "made"})
        if keep_db:
            ledgers[receipts] = keep(e, ledgers[receipts], keep_db)
    largest = ledgers[receipts]
    out: dict[str, Any] = {"receipts": receipts, "scopes": scopes, "pages_only": pages_only,
                           "kept_db": keep_db or reuse_db,
                           "scopes_seconds": scopes_seconds,
                           "ledgers": {n: {k: v for k, v in led.items()
                                           if k in ("load_seconds", "rollups_seconds",
                                                    "vacuum_seconds", "disk_mb", "tables")}
                                       for n, led in ledgers.items()}}
    # A phase that fails (a full connection table, say) is recorded as its error; the
    # other phases still run.
    # At 1M the big measure times the pages already; here they are timed above it.
    out["dashboard"] = _phase("dashboard", lambda: big.dashboard(
        e, largest["url"], largest["made"], rounds)) if receipts > PURGE_BASELINE or pages_only \
        else {}
    if pages_only:
        out["purge"] = {}
        return out
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
