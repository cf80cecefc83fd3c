"""The delivery log at 10 million rows: its page, its API and every filter, on PostgreSQL.

    .venv/bin/python -m bench.dlog_scale [--rows 10000000] [--integrations 100] [--rounds 20]

Loads `rows` delivery log rows over the log's 14-day retention with INSERT ...
generate_series inside PostgreSQL (a million per statement, indexes built
after, as bench/fastload.py does for receipts): real integrations and their
keys, ~90 % accepted, 4 % duplicate, 4 % unauthenticated (half of them with a
dead key), 1 % invalid_event, 0.5 % conflict, 0.4 % body_too_large, 0.1 % to
an unknown integration, a latency on every answer. Then, logged in as an admin
through the real form, times the Deliveries page (and its htmx fragment) and
GET /api/v1/deliveries for each filter and the second page of each (cursor),
a credentials page (per-key usage from the log) and the health page, prints
every filter's EXPLAIN verdict, and times the delivery hours rollup: its full
recount and an incremental run after a minute of new rows. Prints one JSON line
and appends it to bench/results/dlog_scale.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, select, text

from bench.datagen import create_scopes
from bench.env import PASSWORD, BenchEnv, logged_in_client
from bench.report import percentile, record
from jobs import rollup_deliveries
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.access.secrets_box import load_box
from ledger.db.schema import credentials, deliveries
from ledger.reads.deliveries import DeliveryFilter, deliveries_stmt
from ledger.services import ledger_engine

RESULTS = Path(__file__).parent / "results" / "dlog_scale.jsonl"
BATCH = 1_000_000
SPAN = timedelta(days=14)
INDEXES = tuple(sorted(str(index.name) for index in deliveries.indexes))

ROWS = """
INSERT INTO deliveries (at, integration_id, public_id, outcome, http_status, key_id,
                        event_id, client, reason, count, latency_us)
SELECT at, CASE WHEN outcome = 'unknown_integration' THEN NULL ELSE scope_id END,
       public_id, outcome,
       CASE outcome WHEN 'accepted' THEN 202 WHEN 'duplicate' THEN 200 WHEN 'conflict' THEN 409
            WHEN 'unauthenticated' THEN 401 WHEN 'invalid_event' THEN 400
            WHEN 'body_too_large' THEN 413 ELSE 404 END,
       CASE WHEN outcome IN ('accepted', 'duplicate', 'conflict', 'invalid_event') THEN key_id
            WHEN outcome = 'unauthenticated' AND g % 2 = 0 THEN key_id END,
       CASE WHEN outcome IN ('accepted', 'duplicate', 'conflict') THEN 'evt_' || g END,
       '10.0.' || (g % 250) || '.' || (g % 200),
       CASE WHEN outcome IN ('unauthenticated', 'invalid_event', 'body_too_large',
                             'unknown_integration') THEN 'bench: ' || outcome END,
       1, CASE WHEN outcome IN ('accepted', 'duplicate', 'conflict')
               THEN 1500 + floor(random() * 30000)::int END
FROM (
  SELECT g, CAST(:start AS timestamptz) + (:span * g / :n) * interval '1 second' AS at,
         (CAST(:ids AS int[]))[1 + g % :scopes] AS scope_id,
         (CAST(:pids AS text[]))[1 + g % :scopes] AS public_id,
         (CAST(:keys AS text[]))[1 + g % :scopes] AS key_id,
         CASE WHEN u < 0.04 THEN 'duplicate' WHEN u < 0.08 THEN 'unauthenticated'
              WHEN u < 0.09 THEN 'invalid_event' WHEN u < 0.095 THEN 'conflict'
              WHEN u < 0.099 THEN 'body_too_large' WHEN u < 0.1 THEN 'unknown_integration'
              ELSE 'accepted' END AS outcome
  FROM (SELECT g, random() AS u FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g) r
) s
"""


def load(env: BenchEnv, rows: int, integrations: int) -> tuple[str, dict[str, Any]]:
    """Create the integrations and `rows` log rows; return the URL and what was made."""
    url = env.migrated_pg("dlog")
    settings = env.settings(url)
    engine = ledger_engine(settings.with_(statement_timeout_ms=3_600_000))
    end = datetime.now(UTC)
    made = create_scopes(engine, load_box(settings.master_key, settings.var_dir),
                         integrations, now=end - SPAN)
    with engine.begin() as conn:
        keys = {i: k for i, k in conn.execute(select(credentials.c.integration_id,
                                                     credentials.c.key_id))}
        create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                        role="admin", password=PASSWORD, now=end)
    started = time.perf_counter()
    with engine.begin() as conn:
        for index in INDEXES:  # built once after the load, as a restore would
            conn.execute(text(f"DROP INDEX {index}"))
        for lo in range(1, rows + 1, BATCH):
            conn.execute(text(ROWS), {
                "start": end - SPAN, "span": SPAN.total_seconds(), "n": rows, "lo": lo,
                "hi": min(lo + BATCH - 1, rows), "scopes": len(made),
                "ids": [i.id for i in made], "pids": [i.public_id for i in made],
                "keys": [keys[i.id] for i in made]})
    loaded = time.perf_counter() - started
    _recreate_indexes(engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE deliveries"))
        size = conn.execute(text("SELECT pg_total_relation_size('deliveries')")).scalar_one()
    engine.dispose()
    return url, {"load_seconds": round(loaded, 1),
                 "indexed_seconds": round(time.perf_counter() - started, 1),
                 "disk_mb": round(size / 1e6), "end": end, "integrations": made,
                 "keys": keys}


def _recreate_indexes(engine: Engine) -> None:
    """Build the delivery log's indexes as the migrations declare them."""
    with engine.begin() as conn:
        for index in deliveries.indexes:
            index.create(conn)


def _time(client: Any, path: str, rounds: int, headers: dict[str, str]) -> dict[str, float]:
    """Return median and p95 milliseconds of `rounds` GETs (after one warm-up)."""
    assert client.get(path, headers=headers).status_code == 200, path
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, path
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 1),
            "p95_ms": round(percentile(samples, 95), 1)}


def filters(made: dict[str, Any]) -> dict[str, tuple[str, DeliveryFilter]]:
    """Return {name: (query string, the DeliveryFilter it means)} of every filter timed."""
    one = made["integrations"][3]
    key = made["keys"][one.id]
    day = made["end"] - timedelta(days=3)
    since, until = quote(day.isoformat()), quote((day + timedelta(hours=1)).isoformat())
    return {
        "all": ("", DeliveryFilter()),
        "integration": (f"integration={one.public_id}", DeliveryFilter(integration_id=one.id)),
        "key_id": (f"key_id={key}", DeliveryFilter(key_id=key)),
        "outcome": ("outcome=unauthenticated", DeliveryFilter(outcome="unauthenticated")),
        "outcome_rare": ("outcome=body_too_large", DeliveryFilter(outcome="body_too_large")),
        "since_until": (f"since={since}&until={until}",
                        DeliveryFilter(since=day, until=day + timedelta(hours=1))),
        "integration_outcome": (f"integration={one.public_id}&outcome=invalid_event",
                                DeliveryFilter(integration_id=one.id, outcome="invalid_event")),
        # Filters that match nothing: the worst case of a scan that filters as it goes.
        "outcome_none": ("outcome=internal", DeliveryFilter(outcome="internal")),
        "key_unused": ("key_id=key_" + "0" * 22, DeliveryFilter(key_id="key_" + "0" * 22)),
    }


def _plan_verdict(engine: Engine, f: DeliveryFilter) -> str:
    """Return the EXPLAIN's first line and the indexes it names (or a Seq Scan)."""
    compiled = deliveries_stmt(f, None, 51).compile(
        dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    with engine.connect() as conn:
        plan = [r[0] for r in conn.exec_driver_sql("EXPLAIN " + str(compiled),
                                                   compiled.params)]
    used = sorted({i for i in INDEXES if any(i in line for line in plan)})
    seq = any("Seq Scan on deliveries" in line for line in plan)
    return ("SEQ SCAN " if seq else "") + ",".join(used)


def _pages(client: Any, made: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Time the page, its fragment, the API and the API's second page for each filter."""
    out: dict[str, Any] = {}
    for name, (query, _) in filters(made).items():
        api = f"/api/v1/deliveries?{query}"
        out[f"page_{name}"] = _time(client, f"/deliveries?{query}", rounds, {})
        out[f"htmx_{name}"] = _time(client, f"/deliveries?{query}", rounds,
                                    {"HX-Request": "true"})
        out[f"api_{name}"] = _time(client, api, rounds, {})
        cursor = client.get(api).get_json()["next_cursor"]
        if cursor:
            out[f"api_{name}_page2"] = _time(client, f"{api}&cursor={cursor}", rounds, {})
    one = made["integrations"][3].public_id
    out["credentials_one"] = _time(client, f"/credentials/{one}", rounds, {})
    out["health"] = _time(client, f"/credentials/{one}/health", rounds, {})
    return out


def _rollup(engine: Engine, made: dict[str, Any]) -> dict[str, Any]:
    """Time the delivery hours' full recount, then an incremental run a minute later."""
    now = made["end"] + timedelta(seconds=rollup_deliveries.DELIVERY_SETTLE_SECONDS)
    out: dict[str, Any] = {}
    for name, at, full in (("full", now, True), ("incremental", now + timedelta(minutes=1),
                                                  False)):
        started = time.perf_counter()
        with engine.begin() as conn:
            run = rollup_deliveries.refresh_delivery_hours(conn, at, full=full)
        out[name] = {"seconds": round(time.perf_counter() - started, 3),
                     "rows_read": run.rows_read, "cells_written": run.written,
                     "full": run.full}
    return out


def run(rows: int, integrations: int, rounds: int) -> dict[str, Any]:
    """Load, log in, explain and time every filter; return the report."""
    from app import create_app

    env = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-dlog-")))
    try:
        url, made = load(env, rows, integrations)
        engine = ledger_engine(env.settings(url))
        plans = {name: _plan_verdict(engine, f) for name, (_, f) in filters(made).items()}
        rollup = _rollup(engine, made)
        engine.dispose()
        app = create_app(env.app_env(url) | {"LEDGER_LOG_LEVEL": "WARNING"})
        client = logged_in_client(app)
        pages = _pages(client, made, rounds)
        app.extensions["ledger"].close()
        worst = max(pages.values(), key=lambda p: p["p95_ms"])
        return {"bench": "dlog_scale", "rows": rows, "integrations": integrations,
                "rounds": rounds, "load_seconds": made["load_seconds"],
                "indexed_seconds": made["indexed_seconds"], "disk_mb": made["disk_mb"],
                "plans": plans, "rollup": rollup, "pages": pages,
                "max_p95_ms": worst["p95_ms"],
                "target_met": all(p["p95_ms"] <= 300 for p in pages.values())}
    finally:
        env.drop_all()


def main() -> None:
    """Parse arguments, run, print and record the report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--integrations", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    report = run(args.rows, args.integrations, args.rounds)
    record(report, RESULTS)


if __name__ == "__main__":
    main()
