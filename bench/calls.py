"""Python calls per accepted delivery, counted with cProfile (bench/README.md, "Intake CPU").

`python -m bench.calls [--deliveries 1000] [--warmup 200]` builds the app in-process on
a fresh SQLite file and a fresh PostgreSQL database of LEDGER_BENCH_PG_URL (dropped
afterwards), connects a Standard Webhooks, a Stripe and a GitHub sender, signs new
events, and drives the WSGI app (the intake fast path) with them: calls counted
after the warm-up, divided by the deliveries. Deterministic, unlike time on a shared
machine, so a change to the hot path can be compared before and after it. Not part
of `make bench`.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from werkzeug.test import EnvironBuilder

from app import create_app
from bench.env import PG_ADMIN_URL
from ledger.config import Settings
from ledger.db.engine import make_engine, upgrade
from tests.helpers import event_body, make_sender, signed_headers

PROFILES = ("standard-webhooks", "stripe", "github")
KEY = Fernet.generate_key().decode()


@contextmanager
def database(kind: str, tmp: Path) -> Iterator[str]:
    """Yield the URL of a fresh migrated database of `kind`; drop it afterwards."""
    if kind == "sqlite":
        url, name = f"sqlite:///{tmp}/calls.sqlite3", None
    else:
        name = "ledger_bench_calls_" + uuid.uuid4().hex[:10]
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        if name:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        engine = make_engine(Settings(database_url=url, var_dir=tmp, master_key=KEY))
        upgrade(engine)
        engine.dispose()
        yield url
    finally:
        if name:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def calls_per_delivery(kind: str, profile: str, deliveries: int, warmup: int) -> float:
    """Return the Python calls one accepted delivery of `profile` costs on `kind`."""
    tmp = Path(tempfile.mkdtemp(prefix="ledger-bench-calls-"))
    with database(kind, tmp) as url:
        app = create_app({"DATABASE_URL": url, "LEDGER_MASTER_KEY": KEY,
                          "LEDGER_AUDIT_KEY": "bench-calls-audit-key",
                          "LEDGER_VAR_DIR": str(tmp), "LEDGER_SECRET_KEY": "bench"})
        try:
            sender = make_sender(app, name="calls", profile=profile)
            environs = []
            for _ in range(warmup + deliveries):
                event_id = str(uuid.uuid4())
                body = event_body(sender, event_id)
                environs.append(EnvironBuilder(
                    path=f"/hooks/{sender.public_id}", method="POST", data=body,
                    headers=list(signed_headers(sender, body, event_id).items())).get_environ())
            statuses: list[str] = []

            def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
                statuses.append(status[:3])

            for environ in environs[:warmup]:
                list(app.wsgi_app(environ, start_response))
            profiler = cProfile.Profile()
            profiler.enable()
            for environ in environs[warmup:]:
                list(app.wsgi_app(environ, start_response))
            profiler.disable()
        finally:
            app.extensions["ledger"].close()
    if set(statuses) != {"202"}:
        raise SystemExit(f"{profile} on {kind}: not every delivery was accepted: {set(statuses)}")
    calls: int = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
    return calls / deliveries


def main() -> None:
    """Print calls per accepted delivery for each profile on both databases."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    print("| profile | PostgreSQL | SQLite |\n|---|---|---|")
    for profile in PROFILES:
        counts = [calls_per_delivery(kind, profile, args.deliveries, args.warmup)
                  for kind in ("postgresql", "sqlite")]
        print(f"| {profile} | {counts[0]:.1f} | {counts[1]:.1f} |")


if __name__ == "__main__":
    main()
