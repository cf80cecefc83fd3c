"""Failure groups at 1,000,000 failures: the groups page reads counters, not failures.

    .venv/bin/python -m bench.failure_groups [--failures 1000000] [--scopes 1000] [--rounds 20]

Writes `--failures` failed receipts (one attempt each, spread over 7 days, 12 error
signatures over 1,000 scopes in 100 accounts) with their stored groups straight into a
migrated PostgreSQL ledger by SQL, counts them as the worker would have, and times the
groups page (all, one scope, one account, a one-hour and a three-day window) and, as the
baseline measured in the same run, the flat failures page (its first keyset page). Prints
one JSON line and appends it to bench/results/failure_groups.jsonl.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.dashboard import _time
from bench.env import PASSWORD, BenchEnv, logged_in_client
from bench.report import record
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.services import ledger_engine
from ledger.worker.failure_groups import error_signature, group_id, rebuild_counters

RESULTS = Path(__file__).parent / "results" / "failure_groups.jsonl"
SIGNATURES = 12
SPAN = timedelta(days=7)

_FILL = """
INSERT INTO integrations (public_id, account, name, profile, tolerance_seconds, sandbox,
                          created_at)
SELECT 'in_' || lpad(g::text, 22, '0'), 'acct' || (g % 100), 'int' || g, 'stripe', 300,
       false, :start FROM generate_series(1, :scopes) g;
INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, event_id,
                      event_type, body_sha256)
SELECT :start + (:span * g / :n), :start + (:span * g / :n) + interval '1 s',
       1 + (g::bigint * 7919) % :scopes, 2, 1, 'evt_' || md5(g::text), 'demo.credit',
       decode(md5(g::text), 'hex') FROM generate_series(1, :n) g;
INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token, started_at,
                      finished_at, outcome, error)
SELECT scope_id, event_id, 1, 'bench', 1, accepted_at, completed_at, 'failed',
       'ValueError: bench cause ' || (abs(hashtext(event_id)) % :sigs) || ' for acct_'
       || scope_id FROM receipts;
"""


def _load(env: BenchEnv, failures: int, scopes: int) -> str:
    """Create the ledger with its failures, their groups and counters; return its URL."""
    url = env.migrated_pg("groups")
    engine = ledger_engine(env.settings(url).with_(statement_timeout_ms=3_600_000))
    start = datetime.now(UTC) - SPAN
    with engine.begin() as conn:
        for statement in _FILL.split(";\n"):
            if statement.strip():
                conn.execute(text(statement), {"start": start, "span": SPAN, "n": failures,
                                               "scopes": scopes, "sigs": SIGNATURES})
        # Each failure's group, as the worker stores it: the normaliser maps "cause k for
        # acct_S" to one signature per k, so the group follows from k alone.
        ids = {k: group_id("demo.credit", error_signature(f"ValueError: bench cause {k} for "
                                                          "acct_1")) for k in range(SIGNATURES)}
        conn.execute(text(
            "INSERT INTO failure_members (scope_id, event_id, group_id, failed_at) "
            "SELECT a.scope_id, a.event_id, (CAST(:ids AS jsonb) ->> "
            "  (abs(hashtext(a.event_id)) % :sigs)::text), a.finished_at FROM attempts a"),
            {"ids": json.dumps({str(k): v for k, v in ids.items()}), "sigs": SIGNATURES})
        conn.execute(text(
            "INSERT INTO failure_signatures (id, event_type, signature, example, first_seen) "
            "SELECT v, 'demo.credit', 'ValueError: bench cause <n> for <id>', NULL, :start "
            "FROM jsonb_each_text(CAST(:ids AS jsonb)) AS e(k, v) ON CONFLICT DO NOTHING"),
            {"ids": json.dumps({str(k): v for k, v in ids.items()}), "start": start})
        rebuild_counters(conn)
        create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                        role="admin", password=PASSWORD, now=datetime.now(UTC))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return url


def run(failures: int, scopes: int, rounds: int) -> dict[str, Any]:
    """Load, log in, time the pages; return the report."""
    import time

    from app import create_app

    env = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-groups-")))
    try:
        started = time.perf_counter()
        url = _load(env, failures, scopes)
        load_s = round(time.perf_counter() - started, 1)
        app = create_app(env.app_env(url))
        client = logged_in_client(app)
        hour = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
        days = (datetime.now(UTC) - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
        pages = {name: _time(client, path, rounds, {"HX-Request": "true"}) for name, path in (
            ("failures_flat_baseline", "/failures"), ("groups_all", "/failures/groups"),
            ("groups_scope", "/failures/groups?scope=acct7/int7"),
            ("groups_account", "/failures/groups?scope=acct7"),
            ("groups_last_hour", f"/failures/groups?since={hour}"),
            ("groups_3_days_capped", f"/failures/groups?since={days}"))}
        app.extensions["ledger"].close()
        base = pages["failures_flat_baseline"]["median_ms"]
        return {"bench": "failure_groups", "failures": failures, "scopes": scopes,
                "rounds": rounds, "load_seconds": load_s, "pages": pages,
                "median_ratio_to_flat_list": {k: round(v["median_ms"] / base, 2)
                                              for k, v in pages.items()},
                "target_met": all(p["median_ms"] <= 150 and p["p95_ms"] <= 300
                                  for p in pages.values())}
    finally:
        env.drop_all()


def main() -> None:
    """Parse arguments, run, print and record the report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--failures", type=int, default=1_000_000)
    parser.add_argument("--scopes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    report = run(args.failures, args.scopes, args.rounds)
    record(report, RESULTS)


if __name__ == "__main__":
    main()
