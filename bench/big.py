"""Measures on one 1M-receipt ledger: bytes per receipt, dashboard pages, purge under intake.

One load serves five measures, in this order (the purge destroys the data):
1. bytes per receipt, ledger vs the naive schema holding the same rows;
2. the raw batched DELETE on the naive table: the purge's baseline;
3. every dashboard page, in-process (Flask test client, logged in: the view, its SQL
   and the template, without HTTP framing): median and p95 of `rounds` visits;
4. the retention purge of every finished receipt on a copy of that ledger, nothing
   else running, at full speed (duty cycle 1): rows/s and WAL per receipt;
5. the retention purge of every finished receipt at the default pacing while wrk
   keeps delivering new events over HTTP; intake during the purge vs before it,
   and after it, from accepted_at.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench import env as benv
from bench import storage
from bench.datagen import DataSpec, generate
from bench.intake import CONNECTIONS, THREADS, ours_app, signed_files
from bench.loadgen import LUA, wrk_binary
from bench.report import percentile
from jobs.retention import purge
from jobs.retention_batching import Pacer
from ledger.access import audit
from ledger.access.operators import create_operator
from ledger.access.secrets_box import load_box
from ledger.clock import SystemClock
from ledger.services import ledger_engine

PASSWORD = benv.PASSWORD


def load(e: benv.BenchEnv, receipts: int, scopes: int) -> tuple[str, Any]:
    """Create the big ledger: data over the last 7 days, rollups, an admin operator."""
    from jobs.rollups import refresh

    url = e.migrated_pg("big")
    settings = e.settings(url).with_(statement_timeout_ms=600_000)
    engine = ledger_engine(settings)
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
    engine = ledger_engine(e.settings(url).with_(statement_timeout_ms=600_000))
    try:
        sizes = storage.measure_bytes(engine)
        raw = storage.raw_purge(engine)
    finally:
        engine.dispose()
    return {"bytes": sizes, "raw_purge": raw}


def pages(sample_scope: str, public_id: str, event_id: str) -> list[tuple[str, str]]:
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


def timed(client: Any, path: str, rounds: int, headers: dict[str, str]) -> dict[str, float]:
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


def dashboard(e: benv.BenchEnv, url: str, made: Any, rounds: int) -> dict[str, Any]:
    """Time every page (in-process, logged in); return each page's median and p95."""
    from app import create_app

    app = create_app(e.app_env(url))
    try:
        client = benv.logged_in_client(app)
        scope_id, event_id = made.samples[next(iter(made.samples))]
        public_id = next(s.public_id for s in made.scopes if s.id == scope_id)
        return {name: timed(client, path, rounds, {})
                for name, path in pages(made.scopes[0].scope, public_id, event_id)}
    finally:
        app.extensions["ledger"].close()


def copy_ledger(e: benv.BenchEnv, url: str, name: str) -> str:
    """Clone the big ledger's database (file copy: no 500 MB of WAL) and return its URL."""
    source = make_url(url).database
    copy = f"ledger_bench_{e.run_id}_{name}"
    with benv.admin_engine().connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{copy}" TEMPLATE "{source}" STRATEGY FILE_COPY'))
    e.databases.append(copy)
    return make_url(url).set(database=copy).render_as_string(hide_password=False)


def purge_unloaded(e: benv.BenchEnv, url: str) -> dict[str, Any]:
    """Purge every finished receipt at full speed with nothing else running."""
    settings = e.settings(url).with_(retention_seconds=60, statement_timeout_ms=600_000)
    engine = ledger_engine(settings)
    try:
        wal = _wal_bytes(engine)
        started = time.perf_counter()
        result = purge(engine, settings, SystemClock(), pacer=Pacer(1.0))
        seconds = time.perf_counter() - started
        wal = _wal_bytes(engine) - wal
    finally:
        engine.dispose()
    return {"expired_receipts": result.expired_receipts, "purge_seconds": round(seconds, 2),
            "purge_rows_per_s": result.expired_receipts / seconds,
            "wal_bytes_per_receipt": round(wal / max(result.expired_receipts, 1))}


def purge_under_intake(e: benv.BenchEnv, url: str,
                       before_seconds: float = 6, after_seconds: float = 4) -> dict[str, Any]:
    """Purge every finished receipt while wrk delivers new events; compare intake rates.

    Intake is also counted for `after_seconds` after the purge: on a shared machine
    a 4-second "before" window alone swings by +-20 % (a no-purge control read
    0.78-1.43x), and the mean of before and after halves that drift.
    """
    public_id = ours_app(e, url)
    files = signed_files(e.tmp, "purge", public_id, 60)
    settings = e.settings(url).with_(retention_seconds=60, statement_timeout_ms=600_000)
    engine = ledger_engine(settings)
    marks: dict[str, datetime] = {}
    with benv.shipped(e.app_env(url), log=e.tmp / "purge.log") as (base, _):
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
            time.sleep(after_seconds)
            marks["after"] = datetime.now(UTC)
        finally:
            benv.stop(load_proc)
    try:
        before = _accepted_between(engine, public_id, marks["load"] + timedelta(seconds=2),
                                   marks["purge"])
        during = _accepted_between(engine, public_id, marks["purge"], marks["purged"])
        after = _accepted_between(engine, public_id, marks["purged"], marks["after"])
    finally:
        engine.dispose()
    return {"expired_receipts": result.expired_receipts, "purge_seconds": round(seconds, 2),
            "purge_rows_per_s": result.expired_receipts / seconds,
            "duty_cycle": settings.purge_duty_cycle,
            "intake_before_per_s": before, "intake_during_per_s": during,
            "intake_after_per_s": after, "intake_around_per_s": (before + after) / 2}


def _wal_bytes(engine: Any) -> int:
    """Return the server's current WAL insert position in bytes."""
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn)")).scalar_one())


def _accepted_between(engine: Any, public_id: str, start: datetime, end: datetime) -> float:
    """Return receipts/s the bench integration accepted between two instants."""
    with engine.connect() as conn:
        count = conn.execute(text(
            "SELECT count(*) FROM receipts r JOIN integrations i ON i.id = r.scope_id "
            "WHERE i.public_id = :p AND r.accepted_at >= :a AND r.accepted_at < :b"),
            {"p": public_id, "a": start, "b": end}).scalar_one()
    return int(count) / max((end - start).total_seconds(), 1e-6)


def measure(e: benv.BenchEnv, receipts: int, scopes: int,
            rounds: int) -> dict[str, Any]:
    """Load once, then run the five measures in order."""
    started = time.perf_counter()
    url, made = load(e, receipts, scopes)
    out: dict[str, Any] = {"load_seconds": round(time.perf_counter() - started, 1),
                           "receipts": receipts, "scopes": scopes}
    out |= bytes_and_raw_purge(e, url)
    out["dashboard"] = dashboard(e, url, made, rounds)
    copy = copy_ledger(e, url, "big_copy")
    out["purge_unloaded"] = purge_unloaded(e, copy)
    with benv.admin_engine().connect() as conn:
        conn.execute(text(f'DROP DATABASE "{make_url(copy).database}" WITH (FORCE)'))
    e.databases.remove(str(make_url(copy).database))
    out["purge"] = purge_under_intake(e, url)
    return out
