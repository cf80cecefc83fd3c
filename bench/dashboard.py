"""Dashboard page latency on a large PostgreSQL ledger (the issue's target: every page
under 150 ms at the median and 300 ms at p95 with 1,000,000 receipts over 1,000 scopes).

    .venv/bin/python -m bench.dashboard [--receipts 1000000] [--scopes 1000] [--rounds 20]

Loads representative rows (bench/datagen.py), computes the rollups once, logs an admin in
through the real login form and times each page and its htmx fragment in-process (Flask
test client: the view, its SQL and the template, without HTTP framing). Prints one JSON
line and appends it to bench/results/dashboard.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.datagen import DataSpec, generate
from bench.env import PASSWORD, BenchEnv, logged_in_client
from bench.report import percentile, record
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.access.secrets_box import load_box
from ledger.clock import SystemClock
from ledger.services import ledger_engine

RESULTS = Path(__file__).parent / "results" / "dashboard.jsonl"


def _pages(sample_scope: str, public_id: str, event_id: str) -> list[tuple[str, str]]:
    """Return (name, path) of every page the issue lists, with realistic filters."""
    return [
        ("overview", "/"), ("receipts_all", "/receipts"),
        ("receipts_failed", "/receipts?state=failed"),
        ("receipts_scope", f"/receipts?scope={sample_scope}"),
        ("receipts_prefix", "/receipts?prefix=evt_A"),
        ("receipts_type", "/receipts?event_type=invoice.paid"),
        ("receipt_detail", f"/receipts/{public_id}/{event_id}"),
        ("stuck", "/stuck"), ("failures", "/failures"),
        ("failure_groups", "/failures/groups"),
        ("failure_groups_scope", f"/failures/groups?scope={sample_scope}"),
        ("receipts_account", f"/receipts?scope={sample_scope.split('/')[0]}"),
        ("search_event", f"/search?q={event_id}"),  # answers 303 to the receipt
        ("failures_scope", f"/failures?scope={sample_scope}"), ("conflicts", "/conflicts"),
        ("credentials", "/credentials"), ("credentials_one", f"/credentials/{public_id}"),
        ("audit", "/audit"), ("capacity", "/capacity"),
        ("api_receipts", "/api/v1/receipts"), ("api_failures", "/api/v1/failures"),
    ]


def _load(env: BenchEnv, receipts: int, scopes: int) -> tuple[str, Any]:
    """Create a database with the data, rollups and an admin; return its URL and a sample."""
    url = env.migrated_pg("dashboard")
    settings = env.settings(url)
    engine = ledger_engine(settings.with_(statement_timeout_ms=600_000))
    box = load_box(settings.master_key, settings.var_dir)
    generated = generate(engine, box, DataSpec(receipts=receipts, scopes=scopes,
                                               end=datetime.now(UTC)))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    from jobs.rollups import refresh

    refresh(engine, SystemClock(), full_series=True)
    with engine.begin() as conn:
        create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                        role="admin", password=PASSWORD, now=datetime.now(UTC))
    engine.dispose()
    return url, generated


def _time(client: Any, path: str, rounds: int, headers: dict[str, str]) -> dict[str, float]:
    """Return median and p95 milliseconds of `rounds` GETs (after one warm-up)."""
    assert client.get(path, headers=headers).status_code in (200, 303), path
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code in (200, 303), path
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 1),
            "p95_ms": round(percentile(samples, 95), 1)}


def run(receipts: int, scopes: int, rounds: int) -> dict[str, Any]:
    """Load, log in, time every page; return the report."""
    from app import create_app

    env = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-dash-")))
    try:
        started = time.perf_counter()
        url, generated = _load(env, receipts, scopes)
        load_s = round(time.perf_counter() - started, 1)
        app = create_app(env.app_env(url))
        client = logged_in_client(app)
        scope = generated.scopes[0]
        scope_id, event_id = generated.samples[next(iter(generated.samples))]
        public_id = next(s.public_id for s in generated.scopes if s.id == scope_id)
        pages: dict[str, Any] = {}
        for name, path in _pages(scope.scope, public_id, event_id):
            pages[name] = _time(client, path, rounds, {})
            if not path.startswith("/api/"):
                pages[name + "_htmx"] = _time(client, path, rounds, {"HX-Request": "true"})
        app.extensions["ledger"].close()
        worst = max(pages.values(), key=lambda p: p["p95_ms"])
        return {"bench": "dashboard", "receipts": receipts, "scopes": scopes,
                "rounds": rounds, "load_seconds": load_s, "pages": pages,
                "max_median_ms": max(p["median_ms"] for p in pages.values()),
                "max_p95_ms": worst["p95_ms"],
                "target_met": all(p["median_ms"] < 150 and p["p95_ms"] < 300
                                  for p in pages.values())}
    finally:
        env.drop_all()


def main() -> None:
    """Parse arguments, run, print and record the report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--scopes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    report = run(args.receipts, args.scopes, args.rounds)
    record(report, RESULTS)


if __name__ == "__main__":
    main()
