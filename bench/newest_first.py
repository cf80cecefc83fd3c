"""The newest-first receipt lists on a ledger whose new receipts sit in old pages, before and
after migration 0012 (the BRIN index on accepted_at replaced by a btree).

    .venv/bin/python -m bench.newest_first [--receipts 1000000] [--scopes 10000] [--rounds 20]
                                           [--fresh 20000]

One PostgreSQL ledger migrated to 0011 and filled by bench/fastload.py (7 days of receipts
ending an hour ago), VACUUM ANALYZE; then what production does to its physical order,
compressed: a retention purge of one scope in fifty kept for a day only (per-scope
retention: its finished receipts older than a day go, about one row in every page), VACUUM,
and a busy hour of new receipts (`fresh`, 100 a transaction) that go one or two to a page
into the space VACUUM found: every BRIN range then spans old to new, the state a ledger
reaches after one retention period of hourly purges. The list pages are timed
(bench.dashboard's timer: logged in, in-process), the database is migrated to head (timed:
the index build), analysed, and timed again. Prints one JSON line and appends it to
bench/results/newest_first.jsonl.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import Engine, text

from bench import fastload
from bench.big import PASSWORD
from bench.dashboard import _time
from bench.env import BenchEnv, logged_in_client
from bench.report import record
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.access.secrets_box import load_box
from ledger.db.engine import alembic_config
from ledger.services import ledger_engine

RESULTS = Path(__file__).parent / "results" / "newest_first.jsonl"
BEFORE = "0011_health_rollups"
NEW_BATCH = 100
# The fresh hour's event types in bench/fastload.py's mix (in twentieths).
TYPE_MIX = "{" + ",".join(["demo.credit"] * 8 + ["invoice.paid"] * 4 + ["charge.succeeded"] * 3
                          + ["payment_intent.succeeded"] * 3
                          + ["customer.subscription.updated"] * 2) + "}"

# One hour's window of the newest-first list, as ledger/reads/receipts.window_stmt writes it.
HOUR_WINDOW = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT scope_id, event_id, accepted_at FROM receipts
WHERE accepted_at >= :lo AND accepted_at < :hi
ORDER BY accepted_at DESC, scope_id DESC, event_id DESC LIMIT 51
"""


def _migrate(engine: Engine, target: str) -> float:
    """Migrate to `target`; return the seconds it took."""
    started = time.perf_counter()
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)
    return round(time.perf_counter() - started, 1)


def _vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE receipts"))


def load_widened(e: BenchEnv, receipts: int, scopes: int, fresh_rows: int) -> dict[str, Any]:
    """Create the ledger at 0011, fill it, purge its oldest day and write an hour anew."""
    url = e.pg_url("newest_first")
    settings = e.settings(url)
    engine = ledger_engine(settings.with_(statement_timeout_ms=3_600_000))
    now = datetime.now(UTC)
    try:
        _migrate(engine, BEFORE)
        box = load_box(settings.master_key, settings.var_dir)
        made = fastload.copy_scopes(engine, box, scopes, now=now - fastload.SPAN)
        generated = fastload.load_receipts(engine, made, receipts, now - timedelta(hours=1))
        _vacuum(engine)
        with engine.begin() as conn:
            purged = conn.execute(text(
                "DELETE FROM receipts WHERE accepted_at < :cut AND state IN (1, 2)"
                " AND scope_id % 50 = 0"), {"cut": now - timedelta(days=1)}).rowcount
        _vacuum(engine)
        fresh = _write_hour(engine, [s.id for s in made], now, fresh_rows)
        _vacuum(engine)
        with engine.begin() as conn:
            create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                            role="admin", password=PASSWORD, now=now)
    finally:
        engine.dispose()
    return {"url": url, "made": generated, "purged": purged, "fresh": fresh, "now": now}


def _write_hour(engine: Engine, scope_ids: list[int], now: datetime, rows: int) -> int:
    """Write `rows` complete receipts over the last hour, NEW_BATCH per transaction."""
    start = now - timedelta(hours=1)
    for lo in range(0, rows, NEW_BATCH):
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts,"
                " event_id, event_type, body_sha256, result_ref)"
                " SELECT :start + make_interval(secs => 3600.0 * g / :n),"
                " :start + make_interval(secs => 3600.0 * g / :n),"
                " (CAST(:ids AS int[]))[1 + g % :scopes], 1, 1, 'evt_new_' || g,"
                " (CAST(:types AS text[]))[1 + g % 20], sha256(convert_to('new' || g, 'UTF8')),"
                " 'ignored:no-handler'"
                " FROM generate_series(CAST(:lo AS int), CAST(:hi AS int)) g"),
                {"start": start, "n": rows, "ids": "{" + ",".join(map(str, scope_ids)) + "}",
                 "scopes": len(scope_ids), "types": TYPE_MIX,
                 "lo": lo, "hi": min(lo + NEW_BATCH, rows) - 1})
    return rows


def _hour_window(engine: Engine, now: datetime) -> dict[str, Any]:
    """EXPLAIN ANALYZE the newest hour's first page: buffers, time, the scans it used."""
    with engine.connect() as conn:
        raw = conn.execute(text(HOUR_WINDOW), {"lo": now - timedelta(hours=1), "hi": now}
                           ).scalar_one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    top = plan["Plan"]
    return {"buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
            "ms": round(plan["Execution Time"], 1), "scans": _scans(top)}


def _scans(node: dict[str, Any]) -> list[str]:
    """Return the plan's scan nodes as 'Node Type [index]', depth first."""
    here = [f"{node['Node Type']} {node.get('Index Name', '')}".strip()
            ] if "Scan" in node["Node Type"] else []
    return here + [s for child in node.get("Plans", []) for s in _scans(child)]


def _time_pages(e: BenchEnv, url: str, made: Any, now: datetime, rounds: int
                ) -> dict[str, Any]:
    """Time the newest-first pages, the API list and a three-day window's failure groups
    (its newest failures: the partial open index, or the planner's other choice)."""
    from app import create_app

    app = create_app(e.app_env(url))
    try:
        client = logged_in_client(app)
        scope = made.scopes[1]
        pages = {"receipts_all": "/receipts", "api_receipts": "/api/v1/receipts",
                 "receipts_complete": "/receipts?state=complete",
                 "receipts_type": "/receipts?event_type=charge.succeeded",
                 "receipts_scope": f"/receipts?scope={scope.scope}",
                 "receipts_account": f"/receipts?scope={scope.scope.split('/')[0]}",
                 "failure_groups_3_days": "/failures/groups?since="
                 + (now - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")}
        return {name: _time(client, path, rounds, {}) for name, path in pages.items()}
    finally:
        app.extensions["ledger"].close()


def _index_bytes(engine: Engine) -> dict[str, Any]:
    """Return the accepted_at index's bytes per receipt."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM receipts")).scalar_one()
        found = conn.execute(text(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            "WHERE indrelid = 'receipts'::regclass")).all()
    return {name: round(size / rows, 2) for name, size in found}


def run(receipts: int, scopes: int, rounds: int, fresh: int) -> dict[str, Any]:
    """Load the widened ledger, time the pages at 0011 and at head; return the report."""
    env = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-newest-")))
    try:
        started = time.perf_counter()
        led = load_widened(env, receipts, scopes, fresh)
        out: dict[str, Any] = {"bench": "newest_first", "receipts": receipts,
                               "scopes": scopes, "rounds": rounds,
                               "purged": led["purged"], "fresh": led["fresh"],
                               "load_seconds": round(time.perf_counter() - started, 1)}
        engine = ledger_engine(env.settings(led["url"]).with_(statement_timeout_ms=600_000))
        try:
            for phase, target in (("brin", None), ("btree", "head")):
                if target:
                    out["migrate_seconds"] = _migrate(engine, target)
                    _vacuum(engine)
                out[phase] = {"hour_window": _hour_window(engine, led["now"]),
                              "bytes_per_receipt": _index_bytes(engine),
                              "pages": _time_pages(env, led["url"], led["made"], led["now"],
                                                   rounds)}
        finally:
            engine.dispose()
        return out
    finally:
        env.drop_all()


def main() -> None:
    """Parse arguments, run, print and record the report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--scopes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fresh", type=int, default=20_000)
    args = parser.parse_args()
    record(run(args.receipts, args.scopes, args.rounds, args.fresh), RESULTS)


if __name__ == "__main__":
    main()
