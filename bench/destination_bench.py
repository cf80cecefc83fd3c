"""Destination measure: forwarded events/s against a local no-op destination, as a ratio
of the worker's own completions/s with a Python handler, in the same run.

One backlog of queued demo.credit jobs over `SCOPES` scopes (bench.worker_bench.backlog)
is loaded once; every run gets its own copy and four `ledger worker` processes. On the
"handler" side the demo Python handler completes them; on the "forward" side each scope
has a destination taking demo.credit (demo handlers off) that points at
`bench/noop_destination.py` on loopback, so each completion is a signed POST answered 200.
The "crowded" side is the forward side with OTHER_DESTINATIONS more integrations, each with
an idle destination of its own: a worker's round should cost the same however many
destinations other scopes have. The sides run in ABBA order twice; completions are counted
as in the worker measure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, make_url, select, text

from bench import env as benv
from bench import worker_bench
from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.access.secrets_box import load_box
from ledger.db.schema import destinations, integrations
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.store import DestinationSettings, create_destination
from ledger.services import ledger_engine

SCOPES = 10
ORDER = ("handler", "forward", "crowded", "crowded", "forward", "handler") * 2  # ABCCBA, twice
OTHER_DESTINATIONS = 3000
CROWDED_TARGET = 0.9  # a round reads its own scopes' destinations, not every one
# Generous limits: the measure is the HTTP hop, not the admission's hold-backs.
MAX_IN_FLIGHT = 200
TARGET = 0.5  # an HTTP hop per event may halve the worker's own rate, no more


def add_destinations(e: benv.BenchEnv, url: str, target: str) -> None:
    """Give every scope of the copy a destination taking demo.credit, pointing at `target`."""
    settings = e.settings(url)
    engine = ledger_engine(settings)
    box = load_box(settings.master_key, settings.var_dir)
    actor = audit.Actor(name="bench", role="admin")
    try:
        with engine.begin() as conn:
            for public_id in conn.execute(select(integrations.c.public_id)).scalars().all():
                create_destination(
                    conn, box, actor, get_integration(conn, public_id),
                    DestinationSettings(url=target + "/in", event_types=["demo.credit"],
                                        max_in_flight=MAX_IN_FLIGHT),
                    policy=AddressPolicy.from_entries(["127.0.0.1"]), handled_types=(),
                    now=datetime.now(UTC))
    finally:
        engine.dispose()


def add_other_destinations(url: str, count: int) -> None:
    """Add `count` integrations (copies of the first, renamed), each with a copy of the first
    destination: destinations of scopes that have no work queued."""
    copied = [c.name for c in integrations.c if c.name != "id"]
    renamed = ", ".join(f"{name} || '-other-' || n" if name in ("public_id", "account") else name
                        for name in copied)
    columns = [c.name for c in destinations.c if c.name != "id"]
    values = ", ".join("'other-' || i.id" if name == "public_id" else
                       "i.id" if name == "integration_id" else f"d.{name}" for name in columns)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                f"INSERT INTO integrations ({', '.join(copied)}) SELECT {renamed}"
                " FROM integrations, generate_series(1, :count) AS n"
                " WHERE id = (SELECT min(id) FROM integrations)"), {"count": count})
            conn.execute(text(
                f"INSERT INTO destinations ({', '.join(columns)}) SELECT {values}"
                " FROM integrations i, (SELECT * FROM destinations ORDER BY id LIMIT 1) d"
                " WHERE i.account LIKE '%-other-%'"))
    finally:
        engine.dispose()


def measure(e: benv.BenchEnv, seconds: float, jobs_count: int = 40_000) -> dict[str, Any]:
    """Return completions/s of the Python handler and of the forwarding, ABBA interleaved."""
    ledger = [str(benv.BIN / "ledger"), "worker"]
    source = e.migrated_pg("dest_backlog")
    worker_bench.backlog(e, source, jobs_count, SCOPES)
    template = make_url(source).database
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    totals = worker_bench.empty_totals("handler", "forward", "crowded")
    window = seconds / ORDER.count("handler")  # each side runs `seconds` in all
    port = benv.free_port()
    with benv.serve([sys.executable, "-m", "bench.noop_destination", str(port)], {},
                    cwd=benv.ROOT, log=e.tmp / "noop.log", port=port) as (target, noop), \
            open(e.tmp / "workers.log", "ab") as log:
        for run, side in enumerate(ORDER):
            url = e.pg_url(f"dest_{run}_{side}", template=template)
            env = {**base_env, **e.app_env(url)}
            if side in ("forward", "crowded"):
                add_destinations(e, url, target)
                if side == "crowded":
                    add_other_destinations(url, OTHER_DESTINATIONS)
                env |= {"LEDGER_DEMO_HANDLERS": "0", "LEDGER_DESTINATION_ALLOW": "127.0.0.1"}
            figures = worker_bench.completions(url, [ledger] * worker_bench.PROCESSES, env,
                                               log, window)
            _alive(noop)
            for key, value in figures.items():
                totals[side][key] += value
    return {"processes": worker_bench.PROCESSES, "scopes": SCOPES,
            "max_in_flight": MAX_IN_FLIGHT, "target": TARGET,
            "other_destinations": OTHER_DESTINATIONS, "crowded_target": CROWDED_TARGET,
            **{f"{name}_per_s": side["done"] / side["seconds"] for name, side in totals.items()},
            **{f"{name}_cpu_ms_per_job": 1000 * side["cpu"] / side["done"]
               for name, side in totals.items()},
            **{f"{name}_db_cpu_ms_per_job": 1000 * side["db_cpu"] / side["done"]
               for name, side in totals.items()}}


def _alive(process: subprocess.Popen) -> None:
    """Fail the measure if the no-op destination died (every forward would be a retry)."""
    if process.poll() is not None:
        raise RuntimeError(f"the no-op destination exited with {process.returncode}")
