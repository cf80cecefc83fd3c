"""A/B of the pool's liveness check on checkout: none, the poll() check, pool_pre_ping.

`python -m bench.pool_check [--requests 300] [--rounds 10]` on the PostgreSQL of
LEDGER_BENCH_PG_URL (a database of its own, dropped afterwards). It times the
poll() check alone, then, variants interleaved round by round, min and median
over rounds:
- one pool checkout and return (what the check adds to every request);
- one accepted delivery through the app in-process (Flask test client), wall
  time and this process's CPU time.
Not part of `make bench`: on a busy 2-core machine the second is noisy, which is
why the first is printed too (README, "Surviving database faults").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from cryptography.fernet import Fernet
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from app import create_app
from ledger.config import Settings
from ledger.db.engine import (
    _refuse_dead_connection,
    connection_is_alive,
    make_engine,
    upgrade,
)
from tests.helpers import event_body, make_sender, signed_headers

VARIANTS = ("none", "poll", "pre_ping")


def use_variant(engine: Engine, variant: str) -> None:
    """Switch the engine's pool to one variant of the checkout check."""
    if event.contains(engine, "checkout", _refuse_dead_connection):
        event.remove(engine, "checkout", _refuse_dead_connection)
    engine.pool._pre_ping = variant == "pre_ping"
    if variant == "poll":
        event.listen(engine, "checkout", _refuse_dead_connection)


def interleaved(engine: Engine, rounds: int, measure: Callable[[], tuple[float, ...]]
                ) -> dict[str, list[tuple[float, ...]]]:
    """Run `measure` once per variant per round, variants in turn."""
    results: dict[str, list[tuple[float, ...]]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            use_variant(engine, variant)
            results[variant].append(measure())
    return results


def report(title: str, results: dict[str, list[tuple[float, ...]]], labels: list[str]) -> None:
    """Print min and median per variant and each variant's difference to `none`."""
    print(title)
    for i, label in enumerate(labels):
        base = [r[i] for r in results["none"]]
        for variant in VARIANTS:
            xs = [r[i] for r in results[variant]]
            print(f"  {label:<16} {variant:<9} min {min(xs):8.1f} us  median "
                  f"{statistics.median(xs):8.1f} us  (min {min(xs) - min(base):+7.1f} us, "
                  f"{100 * (min(xs) / min(base) - 1):+6.2f}%)")


def main() -> None:
    """Create a database, measure both, drop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    server = os.environ.get("LEDGER_BENCH_PG_URL",
                            "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    name = f"ledger_bench_pool_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    key = Fernet.generate_key().decode()
    try:
        engine = make_engine(Settings(database_url=url, var_dir=Path(tempfile.gettempdir()),
                                      master_key=key))
        upgrade(engine)
        engine.dispose()
        measure_both(url, key, args.requests, args.rounds)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def measure_both(url: str, key: str, requests: int, rounds: int) -> None:
    """Measure a checkout and an accepted delivery under each variant."""
    app = create_app({"DATABASE_URL": url, "LEDGER_MASTER_KEY": key,
                      "LEDGER_VAR_DIR": tempfile.mkdtemp(), "LEDGER_SECRET_KEY": "bench"})
    svc = app.extensions["ledger"]
    sender, client, seq = make_sender(app), app.test_client(), iter(range(10**9))

    def checkout() -> tuple[float, ...]:
        started = time.perf_counter()
        for _ in range(5000):
            with svc.engine.connect():
                pass
        return ((time.perf_counter() - started) / 5000 * 1e6,)

    def deliveries() -> tuple[float, ...]:
        signed = []
        for _ in range(requests):
            event_id = f"pool-{next(seq)}"
            body = event_body(sender.profile, event_id)
            signed.append((body, signed_headers(sender, body, event_id)))
        wall, cpu = time.perf_counter(), time.process_time()
        for body, headers in signed:
            assert client.post(f"/hooks/{sender.public_id}", data=body,
                               headers=headers).status_code == 202
        return ((time.perf_counter() - wall) / requests * 1e6,
                (time.process_time() - cpu) / requests * 1e6)

    with svc.engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        cpu = time.process_time()
        for _ in range(100_000):
            connection_is_alive(dbapi)
        print(f"the poll() check alone: {(time.process_time() - cpu) * 10:.2f} us of CPU a call")
    try:
        report("pool checkout + return", interleaved(svc.engine, rounds, checkout), ["wall"])
        report("accepted delivery (in-process)", interleaved(svc.engine, rounds, deliveries),
               ["wall", "client CPU"])
    finally:
        svc.close()


if __name__ == "__main__":
    main()
