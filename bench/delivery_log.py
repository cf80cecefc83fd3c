"""Delivery log measures: accepted/s with the log on vs off, and a forged flood's growth.

Two gunicorn servers of the ledger, the same shape, each on its own database
holding the same integration (a clone), one with LEDGER_DELIVERY_LOG=off: loaded
in ABBA order (off, on, on, off) with fresh events each run, so the ratio is
measured in the same minutes.

The flood then replays requests signed with a key the integration never had
(401 bad_signature) at the log-on server as fast as wrk can send them, and
compares the rows the log gained with its bound (ledger/intake/delivery_log.py):
per process and per (integration, dead key) bucket, STARTING_TOKENS plus
`refusals_per_minute` per minute exact rows and one count row per minute. The
sum of `count` over the new rows must equal the refusals wrk got answered.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, text

from bench import env as benv
from bench.intake import (
    CONNECTIONS,
    THREADS,
    Run,
    Target,
    abba,
    accepted_per_s,
    ours_app,
    summarize,
)
from bench.loadgen import presign, run_wrk
from ledger.config import DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE
from ledger.intake.delivery_log import FLUSH_SECONDS, STARTING_TOKENS

# A valid Standard Webhooks key that is not the bench integration's: every request is forged.
FORGED_SECRET = "whsec_" + "Zm9yZ2VkLWtleS10aGF0LWlzLW5vdC10aGUtYmVuY2gtb25l"


def _log_rows(url: str) -> tuple[int, int]:
    """Return (rows, sum of count) of refusals in the delivery log."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows, total = conn.execute(text(
                "SELECT count(*), coalesce(sum(count), 0) FROM deliveries"
                " WHERE outcome = 'unauthenticated'")).one()
            return int(rows), int(total)
    finally:
        engine.dispose()


def flood(e: benv.BenchEnv, on: Target, url: str, public_id: str, shape: benv.ServerShape,
          seconds: float) -> dict[str, Any]:
    """Flood the log-on server with forged requests; return its growth next to the bound."""
    prefix = e.tmp / "forged"
    presign(prefix, path=f"/hooks/{public_id}", secret=FORGED_SECRET,
            per_thread=int(6000 * seconds / THREADS) + 500, threads=THREADS, tag="forged")
    before = _log_rows(url)
    started = datetime.now(UTC)
    result = run_wrk(on.base + on.path, prefix, seconds=seconds, connections=CONNECTIONS,
                     threads=THREADS)
    # Counts are written once their minute ends: wait for it, then for one flush.
    time.sleep(60 - datetime.now(UTC).second + 2 * FLUSH_SECONDS + 1)
    after = _log_rows(url)
    minutes = math.ceil((datetime.now(UTC) - started).total_seconds() / 60) + 1
    # Processes that may have served: the workers, plus one per recycle (max_requests).
    lives = shape.workers + result.requests // max(shape.max_requests, 1) + shape.workers
    rate = DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE
    bound = lives * (STARTING_TOKENS + rate * minutes + minutes)
    return {"forged_requests": result.requests, "forged_per_s": result.requests / result.seconds,
            "connection_errors": result.errors, "rows_added": after[0] - before[0],
            "refusals_counted": after[1] - before[1],
            "bound_rows": bound, "minutes": minutes, "process_lives": lives}


def cycle_ratios(on: list[Run], off: list[Run]) -> list[float]:
    """Return accepted/s on over off for each ABBA cycle (two runs a side in each)."""
    return [round(accepted_per_s(on[i:i + 2]) / accepted_per_s(off[i:i + 2]), 3)
            for i in range(0, min(len(on), len(off)), 2)]


def measure(e: benv.BenchEnv, shape: benv.ServerShape, seconds: float) -> dict[str, Any]:
    """Accepted/s log on vs off (ABBA), then the forged flood against the log-on server."""
    url = e.migrated_pg("dlog_on")
    public_id = ours_app(e, url)
    # abba() replays each file at both sides: each side needs its own ledger, with the
    # same integration (a clone), or the second replay would be all duplicates.
    off_url = e.pg_url("dlog_off", template=f"ledger_bench_{e.run_id}_dlog_on")
    log = e.tmp / "delivery-log.log"
    on_env = e.app_env(url)
    off_env = {**e.app_env(off_url), "LEDGER_DELIVERY_LOG": "off"}
    with benv.gunicorn("app:create_app()", off_env, shape, cwd=benv.ROOT,
                       log=log) as (off_base, off_server), \
            benv.gunicorn("app:create_app()", on_env, shape, cwd=benv.ROOT,
                          log=log) as (on_base, on_server):
        off = Target(off_base, off_url, f"/hooks/{public_id}", off_server.pid)
        on = Target(on_base, url, f"/hooks/{public_id}", on_server.pid)
        runs = abba(e, off, on, seconds, "dlog")
        result = summarize(runs)
        result = {"off_accepted_per_s": result["thin_accepted_per_s"],
                  "on_accepted_per_s": result["ours_accepted_per_s"],
                  "off_p99_ms": result["thin_p99_ms"], "on_p99_ms": result["ours_p99_ms"],
                  "off_cpu": result["thin_cpu"], "on_cpu": result["ours_cpu"],
                  "cycle_ratios": cycle_ratios(runs["ours"], runs["thin"]),
                  "runs": {"off": result["runs"]["thin"], "on": result["runs"]["ours"]}}
        result["flood"] = flood(e, on, url, public_id, shape, seconds)
    return result
