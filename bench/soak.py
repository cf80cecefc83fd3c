"""Soak: N minutes of mixed traffic against gunicorn + workers + scheduler on PostgreSQL.

    .venv/bin/python -m bench.soak --minutes 10 [--clients 8] [--web-workers 2]

Not part of `make test`. Traffic per request: new events (70 %), exact duplicates of a
recent event (15 %), conflicting bodies under a recent id (5 %), bad signatures (10 %),
spread over two integrations. The scheduler purges every few seconds with a short
retention, so purge batches run under the load. At the end the workers drain and the
invariant check runs:

- every acknowledged new event is in the ledger, or was purged after completing;
- one receipt and one business effect per (scope, event id): each scope's demo balance
  equals its complete receipts plus the receipts the purge removed;
- no bad signature or conflict wrote a receipt; nothing is left pending.
It prints throughput, error rate, p50/p99 latency per kind and the verdict (exit 1 on a
broken invariant). Loopback only: a database `ledger_bench_<run>_soak` on the
LEDGER_BENCH_PG_URL server, dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select

from bench.env import BIN, ROOT, SECRET, BenchEnv, ServerShape, bench_integration, gunicorn, stop
from bench.report import percentile
from ledger.access.secrets_box import load_box
from ledger.config import Settings
from ledger.db.schema import demo_balances, jobs, receipts
from ledger.intake.signatures import get_profile
from ledger.services import ledger_engine

MIX = (("new", 70), ("duplicate", 15), ("conflict", 5), ("bad_signature", 10))
EXPECTED = {"new": {202}, "duplicate": {200, 202}, "conflict": {409}, "bad_signature": {401}}
RETENTION_SECONDS = 30
RECENT_SECONDS = 10  # duplicates and conflicts target events this recent (inside retention)
SCHEDULE = "retention=5,sweep=5,rollups=5,credential_expiry=10,revocation_propagation=10"


@dataclass(slots=True)
class Tally:
    """Answers per kind, latencies, and what the ledger must now hold."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    acked: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    lock: threading.Lock = field(default_factory=threading.Lock)


class Client(threading.Thread):
    """One sender connection: picks a kind, signs, posts, records."""

    def __init__(self, index: int, base_url: str, public_ids: list[str], tally: Tally,
                 stop_at: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.index, self.base_url, self.public_ids = index, base_url, public_ids
        self.tally, self.stop_at = tally, stop_at
        self.rng = random.Random(seed)
        self.recent: list[tuple[float, str, str, bytes]] = []  # (sent, public id, id, body)
        self.profile = get_profile("standard-webhooks")
        self.count = 0

    def run(self) -> None:
        """Send until the deadline."""
        session = requests.Session()
        kinds = [kind for kind, _ in MIX]
        weights = [weight for _, weight in MIX]
        while time.monotonic() < self.stop_at:
            kind = self.rng.choices(kinds, weights)[0]
            public_id, event_id, body, secret = self._request(kind)
            headers = self.profile.sign(secret, body, event_id=event_id, event_type="demo.credit",
                                        timestamp=int(time.time()))
            headers["Content-Type"] = "application/json"
            started = time.perf_counter()
            try:
                status = session.post(f"{self.base_url}/hooks/{public_id}", data=body,
                                      headers=headers, timeout=15).status_code
            except requests.RequestException:
                status, session = None, requests.Session()
            self._record(kind, status, time.perf_counter() - started, public_id, event_id, body)

    def _request(self, kind: str) -> tuple[str, str, bytes, str]:
        """Return (public id, event id, body, secret) for one request of `kind`."""
        now = time.monotonic()
        self.recent = [r for r in self.recent if now - r[0] < RECENT_SECONDS][-200:]
        if kind in ("duplicate", "conflict") and self.recent:
            _, public_id, event_id, body = self.rng.choice(self.recent)
            if kind == "conflict":
                body = body.replace(b'"amount":1', b'"amount":2')
            return public_id, event_id, body, SECRET
        self.count += 1
        public_id = self.rng.choice(self.public_ids)
        event_id = f"soak-{self.index}-{self.count}"
        body = json.dumps({"type": "demo.credit", "data": {"amount": 1, "n": self.count}},
                          separators=(",", ":")).encode()
        secret = SECRET if kind != "bad_signature" else "whsec_" + "QUFBQUFBQUFBQUFBQUFBQQ=="
        return public_id, event_id, body, secret

    def _record(self, kind: str, status: int | None, seconds: float, public_id: str,
                event_id: str, body: bytes) -> None:
        """Count the answer; remember acknowledged new events."""
        if kind in ("duplicate", "conflict") and not self.recent:
            kind = "new"  # nothing recent yet: it was sent as a new event
        with self.tally.lock:
            self.tally.latencies[kind].append(seconds)
            if status not in EXPECTED[kind]:
                self.tally.errors[kind] += 1
            if kind == "new" and status == 202:
                self.tally.acked[public_id].add(event_id)
        if kind == "new" and status == 202:
            self.recent.append((time.monotonic(), public_id, event_id, body))


def percentile_ms(values: list[float], q: float) -> float:
    """Return the q-th percentile (nearest rank) of seconds, in milliseconds."""
    return round(percentile(values, q) * 1000, 2)


def purged_receipts(base_url: str) -> int:
    """Read ledger_purged_rows_total{kind="receipts"} (the scheduler's count) from /metrics."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ledger_purged_rows_total" and sample.labels == {"kind": "receipts"}:
                return int(sample.value)
    return 0


def drain(engine: Engine, timeout: float = 120.0) -> int:
    """Wait until no job is left; return how many remain."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            left = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
        if left == 0 or time.monotonic() > deadline:
            return int(left)
        time.sleep(0.5)


def check(engine: Engine, scope_of: dict[str, int], tally: Tally, purged: int,
          jobs_left: int) -> dict[str, Any]:
    """Run the invariant check; return its findings."""
    with engine.connect() as conn:
        held = defaultdict(set)
        for scope_id, event_id, state in conn.execute(
                select(receipts.c.scope_id, receipts.c.event_id, receipts.c.state)):
            held[scope_id].add((event_id, state))
        balances = {r.scope_id: r.balance for r in conn.execute(
            select(demo_balances.c.scope_id, demo_balances.c.balance))}
    acked = {scope_of[p]: ids for p, ids in tally.acked.items()}
    missing = sum(len(ids - {e for e, _ in held[s]}) for s, ids in acked.items())
    unexpected = sum(len({e for e, _ in held[s]} - acked.get(s, set())) for s in held)
    complete = {s: sum(1 for _, state in rows if state == 1) for s, rows in held.items()}
    pending = sum(1 for rows in held.values() for _, state in rows if state == 0)
    effects = sum(balances.values())
    result = {
        "acknowledged_new_events": sum(len(ids) for ids in acked.values()),
        "receipts_now": sum(len(rows) for rows in held.values()),
        "purged_receipts": purged, "acked_missing_from_ledger": missing,
        "receipts_not_acknowledged": unexpected, "pending_left": pending,
        "jobs_left": jobs_left, "business_effects": effects,
        "complete_plus_purged": sum(complete.values()) + purged,
    }
    result["ok"] = (missing == purged and unexpected == 0 and pending == 0
                    and jobs_left == 0 and effects == result["complete_plus_purged"])
    return result


def report(tally: Tally, seconds: float, invariant: dict[str, Any]) -> dict[str, Any]:
    """Return the soak's figures."""
    every = [x for values in tally.latencies.values() for x in values]
    kinds = {kind: {"requests": len(values), "errors": tally.errors.get(kind, 0),
                    "error_rate": round(tally.errors.get(kind, 0) / max(1, len(values)), 5),
                    "p50_ms": percentile_ms(values, 50), "p99_ms": percentile_ms(values, 99)}
             for kind, values in sorted(tally.latencies.items())}
    return {"seconds": round(seconds, 1), "requests": len(every),
            "throughput_rps": round(len(every) / seconds, 1),
            "errors": sum(tally.errors.values()),
            "error_rate": round(sum(tally.errors.values()) / max(1, len(every)), 5),
            "p50_ms": percentile_ms(every, 50), "p99_ms": percentile_ms(every, 99),
            "by_kind": kinds, "invariant": invariant}


def soak(minutes: float, clients: int, web_workers: int, worker_threads: int) -> dict[str, Any]:
    """Run the whole soak and return its report."""
    with tempfile.TemporaryDirectory(prefix="ledger-soak-") as tmp, ExitStack() as stack:
        bench = BenchEnv(Path(tmp))
        stack.callback(bench.drop_all)
        url = bench.migrated_pg("soak")
        settings = Settings(database_url=url, var_dir=Path(tmp), master_key=bench.master_key)
        engine = ledger_engine(settings)
        stack.callback(engine.dispose)
        box = load_box(bench.master_key, Path(tmp))
        public_ids = [bench_integration(engine, box, name=f"soak-{n}") for n in range(2)]
        scope_of = _scope_ids(engine, public_ids)
        env = {**bench.app_env(url), "LEDGER_LOG_LEVEL": "WARNING",
               "LEDGER_RETENTION_SECONDS": str(RETENTION_SECONDS),
               "LEDGER_REVIEW_WINDOW_SECONDS": str(RETENTION_SECONDS),
               "LEDGER_SCHEDULER_PERIODS": SCHEDULE,
               "PROMETHEUS_MULTIPROC_DIR": str(Path(tmp) / "metrics")}
        shape = ServerShape(workers=web_workers)
        base, _ = stack.enter_context(gunicorn("app:create_app()", env, shape, cwd=ROOT,
                                               log=Path(tmp) / "web.log"))
        for args in (["worker", "--concurrency", str(worker_threads)], ["scheduler"]):
            stack.enter_context(_process([str(BIN / "ledger"), *args], env, Path(tmp)))
        tally = Tally()
        started = time.monotonic()
        threads = [Client(i, base, public_ids, tally, started + minutes * 60, seed=i)
                   for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        drain_started = time.monotonic()
        jobs_left = drain(engine)
        print(f"drained in {time.monotonic() - drain_started:.1f}s", file=sys.stderr)
        time.sleep(1)
        invariant = check(engine, scope_of, tally, purged_receipts(base), jobs_left)
        return report(tally, elapsed, invariant)


def _scope_ids(engine: Engine, public_ids: list[str]) -> dict[str, int]:
    """Return {public id: scope id}."""
    from ledger.access.integrations import get_integration

    with engine.connect() as conn:
        return {p: get_integration(conn, p).id for p in public_ids}


class _process:
    """Run one ledger process for the soak; stop it on exit."""

    def __init__(self, args: list[str], env: dict[str, str], tmp: Path) -> None:
        self.args, self.env, self.log = args, env, tmp / f"{args[1]}.log"

    def __enter__(self) -> subprocess.Popen:
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(self.args, cwd=str(ROOT), env={**os.environ,
                                            **self.env}, stdout=subprocess.DEVNULL,
                                            stderr=err, start_new_session=True)
        return self.process

    def __exit__(self, *_exc: object) -> None:
        stop(self.process)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, soak, print the report; exit 1 when the invariant check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--worker-threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    args = parser.parse_args(argv)
    result = soak(args.minutes, args.clients, args.web_workers, args.worker_threads)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
        print("INVARIANT", "OK" if result["invariant"]["ok"] else "BROKEN")
    return 0 if result["invariant"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
