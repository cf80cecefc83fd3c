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
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench import env as benv
from bench import storage
from bench.datagen import DataSpec, generate
from bench.fastload import load_sampled_pages
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
        end = datetime.now(UTC)
        made = generate(engine, load_box(settings.master_key, settings.var_dir),
                        DataSpec(receipts=receipts, scopes=scopes, end=end))
        load_sampled_pages(engine, end)  # every page has an item to show
        for table in ("attempts", "jobs", "conflicts", "conflict_bodies", "credentials",
                      "requeue_members", "audit_log"):
            storage.vacuum(engine, table)
        refresh(engine, SystemClock(), full_series=True)
        with engine.begin() as conn:
            create_operator(conn, audit.Actor(name="bench", role="admin"), username="bench",
                            role="admin", password=PASSWORD, now=datetime.now(UTC))
    finally:
        engine.dispose()
    return url, made


def bytes_and_raw_purge(e: benv.BenchEnv, url: str) -> dict[str, Any]:
    """Measure bytes per receipt as loaded (after VACUUM ANALYZE), then the raw purge."""
    engine = ledger_engine(e.settings(url).with_(statement_timeout_ms=600_000))
    try:
        sizes = storage.measure_bytes(engine)
        raw = storage.raw_purge(engine)
    finally:
        engine.dispose()
    return {"bytes": sizes, "raw_purge": raw}


def samples(url: str, made: Any) -> dict[str, str]:
    """Return the ids the pages' parameters name: a receipt, a running one, a revoked key,
    a conflict with its kept body, a failure group, a refused event id without a receipt.

    A table bench/fastload.py fills but datagen does not leaves its samples out; the
    pages that need them are then listed as not measured.
    """
    from sqlalchemy import create_engine

    scope_id, event_id = made.samples[next(iter(made.samples))]
    queries = {
        "running": "SELECT i.public_id, j.event_id FROM jobs j JOIN integrations i"
                   " ON i.id = j.scope_id WHERE j.leased_by IS NOT NULL LIMIT 1",
        "revoked": "SELECT i.public_id, c.key_id FROM credentials c JOIN integrations i"
                   " ON i.id = c.integration_id WHERE c.state = 'revoked' ORDER BY c.id LIMIT 1",
        "conflict": "SELECT f.id FROM conflicts f JOIN conflict_bodies b ON b.scope_id ="
                    " f.scope_id AND b.event_id = f.event_id ORDER BY f.id DESC LIMIT 1",
        "group": "SELECT id FROM failure_signatures ORDER BY id LIMIT 1",
        "refused": "SELECT public_id, event_id FROM deliveries WHERE outcome ="
                   " 'unauthenticated' AND event_id IS NOT NULL ORDER BY id DESC LIMIT 1",
        "batch": "SELECT batch_id FROM requeue_members GROUP BY batch_id"
                 " ORDER BY count(*) DESC LIMIT 1",
        "drill": "SELECT substr(target, 7) FROM audit_log WHERE action = 'drill.finish'"
                 " ORDER BY id DESC LIMIT 1",
        "audit_mid": "SELECT id FROM audit_log ORDER BY id"
                     " OFFSET (SELECT count(*) / 2 FROM audit_log) LIMIT 1",
    }
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = {name: conn.execute(text(sql)).first() for name, sql in queries.items()}
            public_id = conn.execute(text("SELECT public_id FROM integrations WHERE id = :i"),
                                     {"i": scope_id}).scalar_one()
    finally:
        engine.dispose()
    scope = next(s.scope for s in made.scopes if s.id == scope_id)
    out = {"scope": scope, "account": scope.split("/")[0], "public_id": public_id,
           "event_id": event_id, "prefix": scope.split("/")[0][:-2]}
    for name, row in found.items():
        if row is not None:
            out |= {f"{name}_{i}": str(v) for i, v in enumerate(row)}
    return out


# Every GET endpoint of the app (its URL map) with the visits that exercise it; a visit
# whose sample is missing is left out. `pages_not_timed` says which endpoints were not.
PAGES: dict[str, list[tuple[str, str]]] = {
    "dashboard.overview": [("overview", "/")],
    "dashboard.receipts_page": [
        ("receipts_all", "/receipts"), ("receipts_failed", "/receipts?state=failed"),
        ("receipts_scope", "/receipts?scope={scope}"),
        ("receipts_prefix", "/receipts?prefix=evt_A"),
        ("receipts_type", "/receipts?event_type=invoice.paid"),
        ("receipts_account", "/receipts?scope={account}")],
    "dashboard.receipt_page": [("receipt_detail", "/receipts/{public_id}/{event_id}"),
                               ("receipt_running", "/receipts/{running_0}/{running_1}")],
    "dashboard.stuck_page": [("stuck", "/stuck")],
    "dashboard.failures_page": [("failures", "/failures"),
                                ("failures_scope", "/failures?scope={scope}"),
                                ("failures_group", "/failures?group={group_0}")],
    "dashboard.failures_groups": [("failure_groups", "/failures/groups"),
                                  ("failure_groups_scope", "/failures/groups?scope={scope}")],
    "dashboard.requeue_all_followup": [("requeue_followup", "/failures/requeued/{batch_0}")],
    "dashboard.search_page": [("search_event", "/search?q={event_id}"),  # 303 to the receipt
                              ("search_delivery", "/search?q={refused_1}"),  # the log's trace
                              ("search_account", "/search?q={account}")],
    "dashboard.deliveries_page": [
        ("deliveries", "/deliveries"),
        ("deliveries_event", "/deliveries?integration={scope}&event_id={event_id}"),
        ("deliveries_prefix", "/deliveries?integration={prefix}"),
        ("deliveries_outcome", "/deliveries?outcome=unauthenticated"),
        ("deliveries_key", "/deliveries?key_id={revoked_1}")],
    "dashboard.conflicts_page": [("conflicts", "/conflicts"),
                                 ("conflicts_all", "/conflicts?open=0")],
    "dashboard.conflict_page": [("conflict_body", "/conflicts/{conflict_0}")],
    "dashboard.integrations_page": [("credentials", "/credentials"),
                                    ("credentials_account", "/credentials?account={account}")],
    "dashboard.credentials_page": [("credentials_one", "/credentials/{public_id}"),
                                   ("credentials_revoked", "/credentials/{revoked_0}")],
    "dashboard.integration_health": [("integration_health", "/credentials/{public_id}/health")],
    "dashboard.drill_status": [("drill", "/credentials/drill/{drill_0}")],
    "dashboard.destinations_page": [("destinations", "/destinations")],
    "dashboard.audit_page": [("audit", "/audit"),
                             ("audit_action", "/audit?action=receipt.requeue")],
    "dashboard.audit_verify": [("audit_verify", "/audit/verify"),  # the first chunk and one
                               ("audit_verify_mid", "/audit/verify?after={audit_mid_0}")],
    "dashboard.capacity_page": [("capacity", "/capacity")],
    "dashboard.operators_page": [("operators", "/operators")],
    "dashboard.export_list": [("export_receipts_scope", "/export/receipts.csv?scope={scope}")],
    "auth.login": [("login", "/login")],
    "ops.healthz": [("healthz", "/healthz")], "ops.readyz": [("readyz", "/readyz")],
    "ops.prometheus_metrics": [("metrics", "/metrics")],
    "openapi.openapi": [("openapi", "/openapi.json")],
    "api.me": [("api_me", "/api/v1/me")], "api.overview": [("api_overview", "/api/v1/overview")],
    "api.receipts": [("api_receipts", "/api/v1/receipts")],
    "api.receipt": [("api_receipt", "/api/v1/receipts/{public_id}/{event_id}")],
    "api.stuck": [("api_stuck", "/api/v1/stuck")],
    "api.failures": [("api_failures", "/api/v1/failures")],
    "api.conflicts": [("api_conflicts", "/api/v1/conflicts")],
    "api.integrations": [("api_integrations", "/api/v1/integrations")],
    "api.credentials": [("api_credentials", "/api/v1/integrations/{revoked_0}/credentials")],
    "api.deliveries": [("api_deliveries", "/api/v1/deliveries"),
                       ("api_deliveries_event",
                        "/api/v1/deliveries?integration={scope}&event_id={event_id}")],
    "api.destinations": [("api_destinations", "/api/v1/destinations")],
    "api.audit_rows": [("api_audit", "/api/v1/audit")],
    "api.audit_verify": [("api_audit_verify", "/api/v1/audit/verify"),
                         ("api_audit_verify_mid", "/api/v1/audit/verify?after={audit_mid_0}")],
    "api.capacity": [("api_capacity", "/api/v1/capacity")],
}
NOT_PAGES = {"static"}


def pages(app: Any, sample: dict[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Return (name, path) of every visit whose samples exist, and the endpoints untimed."""
    visits, untimed = [], []
    for endpoint in sorted({r.endpoint for r in app.url_map.iter_rules()
                            if "GET" in (r.methods or ()) and r.endpoint not in NOT_PAGES}):
        known = [(name, path.format(**sample)) for name, path in PAGES.get(endpoint, [])
                 if all(k in sample for k in _fields(path))]
        visits += known
        if not known:
            untimed.append(endpoint)
    return visits, untimed


def _fields(path: str) -> list[str]:
    """Return the sample names a path template uses."""
    import string

    return [f for _, f, _, _ in string.Formatter().parse(path) if f]


def timed(client: Any, path: str, rounds: int, headers: dict[str, str]) -> dict[str, float]:
    """Return median and p95 milliseconds of `rounds` GETs (after one warm-up)."""
    first = client.get(path, headers=headers).status_code
    assert first in (200, 303), f"{first} to {path}"
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        response.get_data()  # a streamed answer (an export) is timed to its end
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code in (200, 303), path
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 1),
            "p95_ms": round(percentile(samples, 95), 1)}


# The app the pages are timed on: the retention one day shorter than the data's seven,
# so the next purge has a day of receipts to count (the Capacity page's preview reads
# its capped worst case), and the forensic window on, so conflicts show a kept body.
PAGE_SETTINGS = {"LEDGER_RETENTION_SECONDS": str(6 * 86400),
                 "LEDGER_CONFLICT_BODY_SECONDS": "86400"}


def dashboard(e: benv.BenchEnv, url: str, made: Any, rounds: int) -> dict[str, Any]:
    """Time every page (in-process, logged in); return each page's median and p95.

    Also timed: `ledger purge --preview`'s count (every expired receipt, no cap) as
    `cli_purge_preview`; it is a command, not a page, and is shown without a target.
    """
    from app import create_app

    app = create_app(e.app_env(url) | PAGE_SETTINGS)
    try:
        client = benv.logged_in_client(app)
        visits, untimed = pages(app, samples(url, made))
        out: dict[str, Any] = {}
        for name, path in visits:  # each page to stderr as it is timed: a stopped run says
            try:  # how far it got; a page answering an error is recorded, the rest go on
                out[name] = timed(client, path, rounds, {})
            except AssertionError as error:
                out[name] = {"error": f"answered {error}"}
            print(f"   page {name}: {out[name]}", file=sys.stderr, flush=True)
        out["cli_purge_preview"] = _cli_preview(app)
        out["audit_verify_walk"] = _verify_walk(client)
        out["pages_not_timed"] = untimed
        return out
    finally:
        app.extensions["ledger"].close()


def _cli_preview(app: Any) -> dict[str, float]:
    """Time `ledger purge --preview`'s reading (uncapped) three times: median and max."""
    from ledger.jobs.retention_preview import preview

    svc = app.extensions["ledger"]
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        with svc.engine.connect() as conn:
            preview(conn, svc.settings, svc.clock.now())
        runs.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(runs), 1), "max_ms": round(max(runs), 1)}


def _verify_walk(client: Any) -> dict[str, float]:
    """Time the whole chain's verification as the Audit page walks it, chunk by chunk."""
    started, after, requests = time.perf_counter(), 0, 0
    while True:
        answer = client.get(f"/api/v1/audit/verify?after={after}").get_json()
        requests += 1
        if answer["next"] is None:
            break
        after = answer["next"]
    return {"seconds": round(time.perf_counter() - started, 2), "requests": requests,
            "rows": answer["rows"], "ok": answer["ok"]}


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
