"""Measures on one 1M-receipt ledger: bytes per receipt, dashboard pages, purge under intake.

One load serves three measures, in this order (the purge destroys the data):
1. bytes per receipt, ledger vs the naive schema holding the same rows;
2. the raw batched DELETE on the naive table: the purge's baseline;
3. every dashboard page (bench.dashboard's page list and timer);
4. the retention purge of every finished receipt while wrk keeps delivering new
   events over HTTP; intake during the purge vs before it, from accepted_at.
"""

from __future__ import annotations

import re
import subprocess
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from bench import env as benv
from bench import storage
from bench.datagen import DataSpec, generate
from bench.intake import CONNECTIONS, THREADS, ours_app, signed_files
from bench.loadgen import LUA, wrk_binary
from jobs.retention import purge
from ledger import audit
from ledger.clock import SystemClock
from ledger.db import make_engine
from ledger.operators import create_operator
from ledger.secrets_box import load_box

PASSWORD = "bench admin password"


def load(e: benv.BenchEnv, receipts: int, scopes: int) -> tuple[str, Any]:
    """Create the big ledger: data over the last 7 days, rollups, an admin operator."""
    from jobs.rollups import refresh

    url = e.migrated_pg("big")
    settings = e.settings(url).with_(statement_timeout_ms=600_000)
    engine = make_engine(settings)
    try:
        made = generate(engine, load_box(settings.master_key, settings.var_dir),
                        DataSpec(receipts=receipts, scopes=scopes, end=datetime.now(UTC)))
        for table in ("attempts", "jobs", "conflicts", "audit_log"):
            storage.vacuum(engine, table)
        refresh(engine, SystemClock(), full_series=True)
        with engine.begin() as conn:
            create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                            role="admin", password=PASSWORD, now=datetime.now(UTC))
    finally:
        engine.dispose()
    return url, made


def bytes_and_raw_purge(e: benv.BenchEnv, url: str) -> dict[str, Any]:
    """Measure bytes per receipt (as loaded and after REINDEX), then the raw purge."""
    engine = make_engine(e.settings(url).with_(statement_timeout_ms=600_000))
    try:
        sizes = storage.measure_bytes(engine)
        sizes["packed"] = storage.packed(engine)
        raw = storage.raw_purge(engine)
    finally:
        engine.dispose()
    return {"bytes": sizes, "raw_purge": raw}


def dashboard(e: benv.BenchEnv, url: str, made: Any, rounds: int) -> dict[str, Any]:
    """Time every page with bench.dashboard's list and timer (in-process, logged in)."""
    from app import create_app
    from bench.dashboard import _pages, _time

    app = create_app(e.app_env(url))
    try:
        client = app.test_client()
        form = client.get("/login").get_data(as_text=True)
        token = re.search(r'name="csrf_token" value="([^"]+)"', form)
        client.post("/login", data={"username": "bench", "password": PASSWORD,
                                    "csrf_token": token.group(1) if token else ""})
        scope_id, event_id = made.samples[next(iter(made.samples))]
        public_id = next(s.public_id for s in made.scopes if s.id == scope_id)
        return {name: _time(client, path, rounds, {})
                for name, path in _pages(made.scopes[0].scope, public_id, event_id)}
    finally:
        app.extensions["ledger"].close()


def purge_under_intake(e: benv.BenchEnv, url: str, shape: benv.ServerShape,
                       before_seconds: float = 6) -> dict[str, Any]:
    """Purge every finished receipt while wrk delivers new events; compare intake rates."""
    public_id = ours_app(e, url)
    files = signed_files(e.tmp, "purge", public_id, 60)
    settings = e.settings(url).with_(retention_seconds=60, statement_timeout_ms=600_000)
    engine = make_engine(settings)
    marks: dict[str, datetime] = {}
    with benv.gunicorn("app:create_app()", e.app_env(url), shape, cwd=benv.ROOT,
                       log=e.tmp / "purge.log") as (base, _):
        load_proc = subprocess.Popen(
            [wrk_binary(), "-t", str(THREADS), "-c", str(CONNECTIONS), "-d", "120s",
             "-s", str(LUA), f"{base}/hooks/{public_id}", "--", str(files)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            marks["load"] = datetime.now(UTC)
            time.sleep(before_seconds)
            marks["purge"] = datetime.now(UTC)
            started = time.perf_counter()
            result = purge(engine, settings, SystemClock())
            seconds = time.perf_counter() - started
            marks["purged"] = datetime.now(UTC)
        finally:
            benv.stop(load_proc)
    try:
        before = _accepted_between(engine, public_id, marks["load"] + timedelta(seconds=2),
                                   marks["purge"])
        during = _accepted_between(engine, public_id, marks["purge"], marks["purged"])
    finally:
        engine.dispose()
    return {"expired_receipts": result.expired_receipts, "purge_seconds": round(seconds, 2),
            "purge_rows_per_s": result.expired_receipts / seconds,
            "intake_before_per_s": before, "intake_during_per_s": during}


def _accepted_between(engine: Any, public_id: str, start: datetime, end: datetime) -> float:
    """Return receipts/s the bench integration accepted between two instants."""
    with engine.connect() as conn:
        count = conn.execute(text(
            "SELECT count(*) FROM receipts r JOIN integrations i ON i.id = r.scope_id "
            "WHERE i.public_id = :p AND r.accepted_at >= :a AND r.accepted_at < :b"),
            {"p": public_id, "a": start, "b": end}).scalar_one()
    return int(count) / max((end - start).total_seconds(), 1e-6)


def measure(e: benv.BenchEnv, shape: benv.ServerShape, receipts: int, scopes: int,
            rounds: int) -> dict[str, Any]:
    """Load once, then run the four measures in order."""
    started = time.perf_counter()
    url, made = load(e, receipts, scopes)
    out: dict[str, Any] = {"load_seconds": round(time.perf_counter() - started, 1),
                           "receipts": receipts, "scopes": scopes}
    out |= bytes_and_raw_purge(e, url)
    out["dashboard"] = dashboard(e, url, made, rounds)
    out["purge"] = purge_under_intake(e, url, shape)
    return out
