"""`/metrics`: every documented metric moves when its event happens, and several gunicorn
processes plus a worker and a scheduler process add up to one page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from ledger.access import audit
from ledger.access.credentials import revoke_credential
from ledger.clock import unix
from ledger.scheduling.runner import default_jobs, run_once
from ledger.worker.loop import process_one
from tests.conftest import TEST_MASTER_KEY as KEY
from tests.helpers import WAIT, deliver, event_body, make_sender, signed_headers
from tests.servers import gunicorn_server

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return {(sample name, sorted labels): value} from an exposition page."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(page: dict, name: str, **labels: str) -> float:
    """Return one sample's value (0 when absent)."""
    return page.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def clocked_env(test_env):
    """Jobs fail terminally on their first error."""
    return {**test_env, "LEDGER_MAX_ATTEMPTS": "1"}


def _scrape(client) -> dict:
    """GET /metrics and parse it."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    return samples(response.get_data(as_text=True))


def _traffic(app) -> None:
    """Send one delivery of every outcome, including one signed by a revoked key."""
    svc = app.extensions["ledger"]
    client = app.test_client()
    sender = make_sender(app)
    at = unix(svc.clock.now())
    for event_id, event_type in (("evt_m1", "demo.credit"), ("evt_m2", "demo.fail")):
        assert deliver(client, sender, event_id, event_type, timestamp=at).status_code == 202
    assert deliver(client, sender, "evt_m1", timestamp=at).status_code == 202  # duplicate
    assert deliver(client, sender, "evt_m1", data={"amount": 7},
                   timestamp=at).status_code == 409
    assert deliver(client, sender, "evt_m3", secret="wrong", timestamp=at).status_code == 401
    body = event_body("stripe", "bad id!")
    assert client.post(f"/hooks/{sender.public_id}", data=body, headers=signed_headers(
        sender, body, "bad id!", timestamp=at)).status_code == 400
    with svc.engine.begin() as conn:
        revoke_credential(conn, audit.Actor(name="t", role="admin"), sender.key_id,
                          reason="test", now=svc.clock.now())
    svc.view.invalidate()
    assert deliver(client, sender, "evt_m4", timestamp=at).status_code == 401


def test_each_metric_moves_with_its_event(clocked_app):
    """Deliveries by outcome, latency, attempts, terminal failures, dead keys, runs, state."""
    app = clocked_app
    svc = app.extensions["ledger"]
    client = app.test_client()
    before = _scrape(client)
    _traffic(app)
    svc.clock.advance(30)
    while process_one(svc, "w-metrics"):
        pass
    svc.heartbeat.beat_once()  # the instance row the revocation-lag gauge reads
    for job in default_jobs(svc.settings):
        run_once(svc.engine, svc.settings, svc.clock, job, instance="metrics-test")
    after = _scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for outcome, count in (("accepted", 2), ("duplicate", 1), ("conflict", 1),
                           ("unauthenticated", 2), ("invalid_event", 1)):
        assert delta("ledger_deliveries_total", outcome=outcome) == count, outcome
    assert delta("ledger_intake_seconds_count") >= 4
    assert delta("ledger_dead_key_use_total", state="revoked") == 1
    assert delta("ledger_auth_failures_total", reason="bad_signature") == 1
    assert delta("ledger_attempts_total", event_type="demo.credit", outcome="complete") == 1
    assert delta("ledger_attempts_total", event_type="demo.fail", outcome="failed") == 1
    assert delta("ledger_terminal_failures_total", event_type="demo.fail") == 1
    assert delta("ledger_scheduler_runs_total", job="rollups", outcome="ok") == 1
    assert ("ledger_purged_rows_total", (("kind", "payloads"),)) in after
    # SQLite's one writer: the four claims (2 new, 1 duplicate, 1 conflict) and every
    # write transaction's turn; PostgreSQL has no writer turns.
    if svc.engine.dialect.name == "sqlite":
        assert delta("ledger_sqlite_claims_per_commit_sum") == 4
        assert 1 <= delta("ledger_sqlite_claims_per_commit_count") <= 4
        assert delta("ledger_sqlite_writer_held_seconds_count") >= 4
        assert delta("ledger_sqlite_writer_wait_seconds_count") >= 4
    else:
        assert delta("ledger_sqlite_claims_per_commit_count") == 0
        assert delta("ledger_sqlite_writer_held_seconds_count") == 0
    # State, read from the database at scrape time.
    assert value(after, "ledger_metrics_database_up") == 1
    assert value(after, "ledger_receipts", state="complete") == 1
    assert value(after, "ledger_receipts", state="failed") == 1
    assert value(after, "ledger_receipts", state="pending") == 0
    assert value(after, "ledger_oldest_pending_seconds") == 0
    lag = [k for k in after if k[0] == "ledger_credential_view_age_seconds"]
    assert lag == [("ledger_credential_view_age_seconds",
                    (("instance", svc.heartbeat.instance_id),))]
    assert value(after, "ledger_scheduler_last_success_age_seconds", job="rollups") == 0


def test_oldest_pending_age_follows_the_clock(clocked_app):
    """An unprocessed delivery shows as pending work that ages."""
    app = clocked_app
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    assert deliver(app.test_client(), sender, "evt_old",
                   timestamp=unix(svc.clock.now())).status_code == 202
    svc.clock.advance(125)
    page = _scrape(app.test_client())
    assert value(page, "ledger_oldest_pending_seconds") == pytest.approx(125, abs=0.5)


def test_metrics_answer_while_the_database_is_away(tmp_path):
    """A scrape never fails: the state part reports the database as down."""
    app = create_app({"DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none",
                      "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "k",
                      "LEDGER_MASTER_KEY": "x" * 43 + "="})
    try:
        page = _scrape(app.test_client())
    finally:
        app.extensions["ledger"].close()
    assert value(page, "ledger_metrics_database_up") == 0


def _run(env: dict[str, str], *args: str) -> None:
    """Run one ledger process to completion."""
    done = subprocess.run(args, cwd=str(ROOT), env=env, capture_output=True, timeout=WAIT,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


SCHEDULED_ROLLUP = (
    "from app import create_app\n"
    "from ledger.scheduling.runner import default_jobs, run_once\n"
    "svc = create_app().extensions['ledger']\n"
    "job = next(j for j in default_jobs(svc.settings) if j.name == 'rollups')\n"
    "assert run_once(svc.engine, svc.settings, svc.clock, job, instance='metrics-proc')\n"
)


@pytest.mark.slow
@pytest.mark.postgres_only
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_gunicorn_processes_a_worker_and_a_scheduler_add_up(test_env, tmp_path):
    """Every scrape, whichever process answers it, shows the totals of all processes."""
    env = {**os.environ, **test_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
           "LEDGER_LOG_LEVEL": "WARNING"}
    setup = create_app(test_env)
    sender = make_sender(setup)
    setup.extensions["ledger"].close()
    with gunicorn_server(env, workers=2) as (base_url, _process):
        sent = _deliver_until_both_serve(base_url, sender, tmp_path / "metrics")
        _run(env, str(BIN / "ledger"), "worker", "--burst")
        _run(env, sys.executable, "-c", SCHEDULED_ROLLUP)
        pages = [samples(requests.get(f"{base_url}/metrics", timeout=10,
                                      headers={"Connection": "close"}).text)
                 for _ in range(6)]
    for page in pages:
        assert value(page, "ledger_deliveries_total", outcome="accepted") == sent
        assert value(page, "ledger_intake_seconds_count") == sent
        assert value(page, "ledger_attempts_total", event_type="demo.credit",
                     outcome="complete") == sent
        assert value(page, "ledger_scheduler_runs_total", job="rollups", outcome="ok") == 1
        assert value(page, "ledger_receipts", state="complete") == sent


def test_a_scrape_answers_past_an_empty_metrics_file(test_env, tmp_path):
    """A process killed while it created its metrics file leaves the file empty for good
    (prometheus/client_python#1199): every scrape must still answer, with the others' sums."""
    metrics_dir = tmp_path / "metrics"
    env = {**os.environ, **test_env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
           "LEDGER_LOG_LEVEL": "WARNING"}
    setup = create_app(test_env)
    sender = make_sender(setup)
    setup.extensions["ledger"].close()
    with gunicorn_server(env, workers=1) as (base_url, _process):
        for n in range(3):
            body = event_body("stripe", f"evt_e{n}")
            assert requests.post(f"{base_url}/hooks/{sender.public_id}", data=body,
                                 headers=signed_headers(sender, body, f"evt_e{n}"),
                                 timeout=10).status_code == 202
        # Above the kernel's largest pid (4194304): a process that is gone for good.
        for kind in ("counter", "histogram", "gauge_livesum"):
            (metrics_dir / f"{kind}_4194999.db").write_bytes(b"")
        pages = [requests.get(f"{base_url}/metrics", timeout=10) for _ in range(2)]
    assert [page.status_code for page in pages] == [200, 200]
    assert value(samples(pages[-1].text), "ledger_deliveries_total", outcome="accepted") == 3


def accepted_by_process(metrics_dir: Path) -> dict[int, float]:
    """Return each process's own count of accepted deliveries, read from its file alone."""
    counts: dict[int, float] = {}
    for file in metrics_dir.glob("counter_*.db"):
        with tempfile.TemporaryDirectory() as alone:
            shutil.copy(file, alone)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=alone)
            found = registry.get_sample_value("ledger_deliveries_total",
                                              {"outcome": "accepted"})
        if found:
            counts[int(file.stem.rsplit("_", 1)[1])] = found
    return counts


def _deliver_until_both_serve(base_url: str, sender, metrics_dir: Path) -> int:  # type: ignore[no-untyped-def]
    """Send batches of concurrent deliveries until two processes accepted some; return n."""
    def post(n: int) -> int:
        body = event_body("stripe", f"evt_g{n}")
        return requests.post(f"{base_url}/hooks/{sender.public_id}", data=body,
                             headers={**signed_headers(sender, body, f"evt_g{n}"),
                                      "Connection": "close"}, timeout=10).status_code

    sent = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(30):
            assert set(pool.map(post, range(sent, sent + 16))) == {202}
            sent += 16
            if len(accepted_by_process(metrics_dir)) >= 2:
                return sent
    raise AssertionError("one gunicorn process took every delivery; aggregation untested")


def test_gunicorn_conf_is_valid_and_sets_the_production_limits(tmp_path):
    """gunicorn accepts the config file and applies its limits and recycling."""
    done = subprocess.run([str(BIN / "gunicorn"), "-c", str(ROOT / "gunicorn.conf.py"),
                           "--print-config", "app:create_app()"], cwd=str(ROOT),
                          env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "m"),
                               "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_MASTER_KEY": KEY,
                               "DATABASE_URL": f"sqlite:///{tmp_path / 'l.sqlite3'}"},
                          capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 0, done.stderr
    config = {name.strip(): value.strip() for name, _, value in
              (line.partition("=") for line in done.stdout.splitlines()) if value}
    # gthread whose event loop buffers request heads (ledger/web/buffering_worker.py).
    assert config["worker_class"] == "ledger.web.buffering_worker.BufferingThreadWorker"
    assert int(config["max_requests"]) > 0 and int(config["max_requests_jitter"]) > 0
    assert int(config["limit_request_line"]) == 4094
    assert config["http_parser"] == "fast"  # gunicorn_h1c (tests/integration/test_http_parser.py)
    assert int(config["timeout"]) == 30
    assert (tmp_path / "m").is_dir()
