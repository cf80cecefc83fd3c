"""Real worker processes on PostgreSQL: crash cuts, a killed connection, many workers at once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from sqlalchemy import func, select, text

from ledger.db.schema import attempts, jobs, receipts
from ledger.demo.seed import balance
from ledger.reads.receipts import get_receipt
from ledger.worker.loop import process_one
from tests.helpers import WAIT, deliver, event_body, make_sender, signed_headers
from tests.servers import gunicorn_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only,
              pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)]

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]

# A worker process with a cut point: it stops dead (the test kills it) inside its
# completion transaction, right after that commit, or keeps its connection busy
# inside the transaction until the test terminates it from the server side.
CHILD = r"""
import pathlib, signal, sys, threading, time
from sqlalchemy import text
from app import create_app
from ledger.worker.loop import WorkerHooks, process_one, run_worker

mode, marker = sys.argv[1], pathlib.Path(sys.argv[2])
svc = create_app().extensions["ledger"]

def before_commit(conn, event):
    if mode == "before-commit":
        marker.write_text("in-transaction")
        time.sleep(120)
    if mode == "terminate" and event.attempt == 1:
        marker.write_text(str(conn.execute(text("SELECT pg_backend_pid()")).scalar()))
        for _ in range(2400):
            conn.execute(text("SELECT 1"))
            time.sleep(0.05)

def after_commit(event):
    if mode == "after-commit":
        marker.write_text("committed")
        time.sleep(120)

hooks = WorkerHooks(before_commit=before_commit, after_commit=after_commit)
if mode == "terminate":
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_worker(svc, hooks=hooks, worker_id="child", stop=stop)
else:
    process_one(svc, "child", hooks=hooks)
"""


@pytest.fixture
def crash_env(test_env, tmp_path):
    """Short leases and retries so that recovery happens within the test."""
    return {**test_env, "LEDGER_LEASE_SECONDS": "2", "LEDGER_RETRY_BASE_SECONDS": "1",
            "LEDGER_LOG_LEVEL": "WARNING"}


@pytest.fixture
def crash_app(crash_env):
    from app import create_app

    app = create_app(crash_env)
    yield app
    app.extensions["ledger"].close()


def _spawn_child(env, mode: str, marker: Path, log: Path) -> subprocess.Popen:
    """Start the cut-point worker in its own process."""
    with log.open("w") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-c", CHILD, mode, str(marker)],
                                cwd=str(ROOT), env={**os.environ, **env},
                                stdout=subprocess.DEVNULL, stderr=stderr)


def _wait_for(predicate, what: str, process: subprocess.Popen | None = None, *,
              timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the worker exited ({process.returncode}) before {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(WAIT)


def _outcome(app, sender, event_id):
    """Return what a user sees: receipt state and result, balance, job left, history."""
    svc = app.extensions["ledger"]
    with svc.engine.connect() as conn:
        receipt = get_receipt(conn, sender.scope, event_id)
        job = conn.execute(select(jobs.c.event_id).where(jobs.c.scope_id == sender.scope_id))
        history = [r.outcome for r in conn.execute(
            select(attempts.c.outcome).where(attempts.c.scope_id == sender.scope_id)
            .order_by(attempts.c.number)).all()]
        return {"state": receipt.state.value, "result_ref": receipt.result_ref,
                "balance": balance(conn, sender.scope_id), "jobs": len(job.all()),
                "history": history}


def _recover(app, sender, event_id) -> None:
    """Run workers in this process until the event completes (after the dead lease)."""
    svc = app.extensions["ledger"]
    _wait_for(lambda: process_one(svc, "recovery") is not None
              and _outcome(app, sender, event_id)["state"] == "complete", "recovery")


def _baseline(app) -> dict:
    """The same event processed with no crash, in another scope."""
    sender = make_sender(app, account="control")
    assert deliver(app.test_client(), sender, "evt_cut", "demo.credit",
                   {"amount": 7}).status_code == 202
    assert process_one(app.extensions["ledger"], "control")
    return _outcome(app, sender, "evt_cut")


def _kill_child_at(crash_env, cut: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Run a worker child until it reaches `cut`, then kill -9 it there."""
    marker = tmp_path / "marker"
    child = _spawn_child(crash_env, cut, marker, tmp_path / "child.log")
    try:
        _wait_for(marker.exists, f"the child to reach {cut}", child)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        _stop(child)


def test_kill_before_local_commit(crash_app, crash_env, tmp_path):
    sender = make_sender(crash_app)
    assert deliver(crash_app.test_client(), sender, "evt_cut", "demo.credit",
                   {"amount": 7}).status_code == 202
    _kill_child_at(crash_env, "before-commit", tmp_path)
    during = _outcome(crash_app, sender, "evt_cut")
    assert (during["state"], during["balance"], during["jobs"]) == ("pending", 0, 1)
    _recover(crash_app, sender, "evt_cut")
    after = _outcome(crash_app, sender, "evt_cut")
    expected = _baseline(crash_app)
    assert {k: after[k] for k in ("state", "result_ref", "balance", "jobs")} == {
        k: expected[k] for k in ("state", "result_ref", "balance", "jobs")}
    assert after["history"] == ["lost", "complete"]


def test_kill_right_after_local_commit(crash_app, crash_env, tmp_path):
    sender = make_sender(crash_app)
    assert deliver(crash_app.test_client(), sender, "evt_cut", "demo.credit",
                   {"amount": 7}).status_code == 202
    _kill_child_at(crash_env, "after-commit", tmp_path)
    time.sleep(2.5)  # past the dead worker's lease: nothing may become due again
    assert process_one(crash_app.extensions["ledger"], "recovery") is False
    after = _outcome(crash_app, sender, "evt_cut")
    expected = _baseline(crash_app)
    assert after == expected == {"state": "complete", "result_ref": "credit:7", "balance": 7,
                                 "jobs": 0, "history": ["complete"]}


def test_connection_terminated_mid_job(crash_app, crash_env, tmp_path):
    sender = make_sender(crash_app)
    assert deliver(crash_app.test_client(), sender, "evt_cut", "demo.credit",
                   {"amount": 7}).status_code == 202
    marker = tmp_path / "backend_pid"
    child = _spawn_child(crash_env, "terminate", marker, tmp_path / "child.log")
    try:
        _wait_for(lambda: marker.exists() and marker.read_text().strip(),
                  "the child's transaction", child)
        with crash_app.extensions["ledger"].engine.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"),
                                {"pid": int(marker.read_text())}).scalar()
        _wait_for(lambda: _outcome(crash_app, sender, "evt_cut")["state"] == "complete",
                  "the worker to recover on a new connection", child)
        child.send_signal(signal.SIGTERM)
        assert child.wait(WAIT) == 0
    finally:
        _stop(child)
    after = _outcome(crash_app, sender, "evt_cut")
    assert {k: after[k] for k in ("state", "result_ref", "balance", "jobs")} == {
        "state": "complete", "result_ref": "credit:7", "balance": 7, "jobs": 0}
    assert after["history"] == ["interrupted", "complete"]  # the database's fault: no attempt spent


# --- many workers -------------------------------------------------------------------

EVENTS = 2000
WORKERS = 4
PROFILES = ("stripe", "standard-webhooks", "github", "stripe")


def _plan(senders, rng: random.Random):
    """Return (deliveries in sending order, expected balance per scope id)."""
    deliveries, expected = [], {s.scope_id: 0 for s in senders}
    for n in range(EVENTS):
        sender = senders[n % len(senders)]
        event_id, amount = f"evt_{n:05d}", rng.randint(1, 1000)
        expected[sender.scope_id] += amount
        # Distinct bodies: GitHub's unsigned ids make a repeated body a replay.
        body = event_body(sender.profile, event_id, "demo.credit", {"amount": amount, "n": n})
        copies = rng.randint(2, 5) if rng.random() < 0.3 else 1
        # Copies go out back to back, so the pool's threads race them.
        deliveries += [(sender, event_id, body)] * copies
    return deliveries, expected


def _post_all(base_url: str, deliveries) -> list[int]:
    """POST every delivery from 16 threads; return the status codes."""
    local = threading.local()

    def post(item) -> int:
        sender, event_id, body = item
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        response = session.post(f"{base_url}/hooks/{sender.public_id}", data=body,
                                headers=signed_headers(sender, body, event_id), timeout=30)
        return response.status_code

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(post, deliveries))


def _spawn_worker(env, log: Path) -> subprocess.Popen:
    """Start `ledger worker` in its own process."""
    with log.open("w") as stderr:
        return subprocess.Popen([str(BIN / "ledger"), "worker"], cwd=str(log.parent),
                                env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                stderr=stderr)


def _counts(app) -> tuple[int, int, int]:
    with app.extensions["ledger"].engine.connect() as conn:
        done = conn.execute(select(func.count()).select_from(receipts)
                            .where(receipts.c.state == 1)).scalar_one()
        total = conn.execute(select(func.count()).select_from(receipts)).scalar_one()
        left = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
        return int(done), int(total), int(left)


def test_four_workers_2000_events_with_concurrent_duplicates(app, test_env, tmp_path):
    # A lock wait past lock_timeout on a busy machine is a legitimate retry: keep it short.
    env = {**test_env, "LEDGER_LOG_LEVEL": "WARNING", "LEDGER_DB_POOL_SIZE": "4",
           "LEDGER_RETRY_BASE_SECONDS": "1"}
    senders = [make_sender(app, account=f"acct{i}", name=f"hooks-{i}", profile=profile)
               for i, profile in enumerate(PROFILES)]
    deliveries, expected = _plan(senders, random.Random(20261130))
    workers = [_spawn_worker(env, tmp_path / f"worker{i}.log") for i in range(WORKERS)]
    try:
        with gunicorn_server(env, workers=3) as (base_url, _server):
            statuses = _post_all(base_url, deliveries)
        assert set(statuses) <= {200, 202}, sorted(set(statuses))
        _wait_for(lambda: _counts(app) == (EVENTS, EVENTS, 0), "every receipt complete",
                  timeout=90)
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        assert [w.wait(WAIT) for w in workers] == [0] * WORKERS
    finally:
        for worker in workers:
            _stop(worker)
    with app.extensions["ledger"].engine.connect() as conn:
        assert {s.scope_id: balance(conn, s.scope_id) for s in senders} == expected
        # Every event completed exactly once, and no worker lost a job.
        completions = conn.execute(
            select(attempts.c.event_id, func.count()).where(attempts.c.outcome == "complete")
            .group_by(attempts.c.scope_id, attempts.c.event_id)).all()
        assert len(completions) == EVENTS and {n for _, n in completions} == {1}
        assert conn.execute(select(func.count()).select_from(attempts)
                            .where(attempts.c.outcome == "lost")).scalar_one() == 0
    assert len(deliveries) > EVENTS * 1.5  # the duplicates really were sent
