"""A rolling deploy with real worker processes, on SQLite and PostgreSQL.

A newer worker has the handler of `t.new`; an older one (the demo handlers only)
must leave `t.new` events to it while it is live, even while it is stopped
(SIGSTOP) within its heartbeat window, spending none of their attempts, and
still finish its own work and its `--burst`, and a job it hands back again and again
keeps one `handed-off` attempt row. Only when no live worker has the handler does the
older one complete them as ignored.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from app import create_app
from ledger.db.schema import attempts, instances, jobs, receipts
from ledger.db.writer_turns import turns_path
from ledger.domain import ReceiptState
from tests.helpers import WAIT, deliver, make_sender

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]

NEW_HANDLER = '''
from ledger.demo.handlers import add_to_balance
from ledger.handlers import Event, handler


@handler("t.new")
def new(conn, event: Event) -> str:
    return f"new:{add_to_balance(conn, event.scope_id, event.payload['data']['amount'])}"
'''


@pytest.fixture(params=["1", "4"], ids=["single", "batched"])
def deploy(test_env, tmp_path, request):
    """The app on the test database, and the environment of both workers (either path)."""
    (tmp_path / "newer_handlers.py").write_text(NEW_HANDLER)
    env = {**os.environ, **test_env, "LEDGER_REVOCATION_BOUND_SECONDS": "60",
           "LEDGER_LOG_LEVEL": "WARNING", "LEDGER_WORKER_BATCH": request.param}
    app = create_app(test_env)
    yield app, env
    app.extensions["ledger"].close()


@contextmanager
def _newer_worker(env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run a long-lived worker with the t.new handler; stop it (by its pid) afterwards."""
    newer = {**env, "LEDGER_HANDLER_MODULES": "newer_handlers",
             "PYTHONPATH": os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])}
    with (tmp_path / "newer.log").open("wb") as log:
        process = subprocess.Popen([str(BIN / "ledger"), "worker"], cwd=str(ROOT), env=newer,
                                   stdout=log, stderr=log)
        try:
            yield process
        finally:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=WAIT)


def _wait_for(condition, what: str, process: subprocess.Popen[bytes] | None = None) -> None:  # type: ignore[no-untyped-def]
    """Poll `condition` until it holds (bounded by WAIT)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert process is None or process.poll() is None, f"the worker exited: {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _published(app) -> bool:  # type: ignore[no-untyped-def]
    """Tell whether a worker instance published the t.new handler."""
    with app.extensions["ledger"].engine.connect() as conn:
        return any("t.new" in (h or "") for h in conn.execute(
            select(instances.c.handles).where(instances.c.kind == "worker")).scalars())


def _sqlite_writable(url: str) -> bool:
    """Tell whether another process can take its writer turn and SQLite's write lock now."""
    database = make_url(url).database or ""
    with open(turns_path(database), "a+b") as turn:
        try:  # a worker stopped while it holds its turn would block every other writer
            fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            db = sqlite3.connect(database, timeout=0.2)
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("ROLLBACK")
                return True
            except sqlite3.OperationalError:
                return False
            finally:
                db.close()
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)


def _stopped(pid: int) -> bool:
    """Tell whether the kernel has stopped the process (state T in /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def _freeze(process: subprocess.Popen[bytes], url: str) -> None:
    """SIGSTOP the worker outside any transaction (a stopped SQLite writer blocks all).

    The check waits until the worker is stopped: a signal sent is not yet a process stopped,
    and a worker still running could take its writer turn just after the check saw it free.
    """
    deadline = time.monotonic() + WAIT
    while True:
        process.send_signal(signal.SIGSTOP)
        while not _stopped(process.pid):
            assert time.monotonic() < deadline, "the worker never stopped"
            time.sleep(0.005)
        if not url.startswith("sqlite") or _sqlite_writable(url):
            return
        process.send_signal(signal.SIGCONT)  # caught mid-transaction: let it finish
        assert time.monotonic() < deadline, "the worker never left its transaction"
        time.sleep(0.05)


def _older_burst(env: dict[str, str]) -> str:
    """Run the older worker (no t.new handler) with --burst; return its stderr."""
    done = subprocess.run([str(BIN / "ledger"), "worker", "--burst"], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def _receipts(app, event_type: str) -> list[tuple[str, str | None, int | None]]:  # type: ignore[no-untyped-def]
    """Return (state, result_ref, job attempts) of every receipt of a type."""
    joined = receipts.outerjoin(jobs, (jobs.c.scope_id == receipts.c.scope_id)
                                & (jobs.c.event_id == receipts.c.event_id))
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(receipts.c.state, receipts.c.result_ref, jobs.c.attempts)
                            .select_from(joined).where(receipts.c.event_type == event_type)
                            .order_by(receipts.c.event_id)).all()
    return [(ReceiptState.from_code(r.state).value, r.result_ref, r.attempts) for r in rows]


def _outcomes(app, event_type: str) -> set[str]:  # type: ignore[no-untyped-def]
    """Return the attempt outcomes of every receipt of a type."""
    with app.extensions["ledger"].engine.connect() as conn:
        return set(conn.execute(select(attempts.c.outcome).join(
            receipts, (receipts.c.scope_id == attempts.c.scope_id)
            & (receipts.c.event_id == attempts.c.event_id))
            .where(receipts.c.event_type == event_type)).scalars())


def test_an_older_worker_leaves_a_new_type_to_a_live_newer_one(deploy, tmp_path, test_env):
    app, env = deploy
    sender = make_sender(app)
    client = app.test_client()
    with _newer_worker(env, tmp_path) as newer:
        _wait_for(lambda: _published(app), "the newer worker's registration", newer)
        _freeze(newer, test_env["DATABASE_URL"])  # stopped, still within its heartbeat window
        for n in range(3):
            assert deliver(client, sender, f"evt_new_{n}", "t.new",
                           {"amount": 10}).status_code == 202
        assert deliver(client, sender, "evt_old", "demo.credit", {"amount": 1}).status_code == 202
        _older_burst(env)  # --burst ends although t.new jobs stay queued
        assert _receipts(app, "t.new") == [("pending", None, 0)] * 3  # no attempt spent
        assert _outcomes(app, "t.new") == {"handed-off"}
        assert _receipts(app, "demo.credit") == [("complete", "credit:1", None)]
        newer.send_signal(signal.SIGCONT)
        _wait_for(lambda: all(s == "complete" for s, _, _ in _receipts(app, "t.new")),
                  "the newer worker to complete t.new", newer)
        assert sorted(r for _, r, _ in _receipts(app, "t.new")) == [
            "new:11", "new:21", "new:31"]
    # The newer worker stopped (and deregistered): no live worker has the handler now.
    assert deliver(client, sender, "evt_new_late", "t.new", {"amount": 10}).status_code == 202
    _older_burst(env)
    assert _receipts(app, "t.new")[-1] == ("complete", "ignored:no-handler", None)


def _history(app, event_type: str) -> list[tuple[int, str | None]]:  # type: ignore[no-untyped-def]
    """Return (number, outcome) of every attempt row of a type's receipts, in order."""
    joined = attempts.join(receipts, (receipts.c.scope_id == attempts.c.scope_id)
                           & (receipts.c.event_id == attempts.c.event_id))
    with app.extensions["ledger"].engine.connect() as conn:
        return [(r.number, r.outcome) for r in conn.execute(
            select(attempts.c.number, attempts.c.outcome).select_from(joined)
            .where(receipts.c.event_type == event_type).order_by(attempts.c.number))]


def _due(app, event_type: str) -> bool:  # type: ignore[no-untyped-def]
    """Tell whether every queued job of a type is due (its hand-back's wait has passed)."""
    now = datetime.now(UTC)
    with app.extensions["ledger"].engine.connect() as conn:
        return all(run_at <= now for run_at in conn.execute(
            select(jobs.c.run_at).where(jobs.c.event_type == event_type)).scalars())


def test_handing_a_job_back_again_and_again_leaves_one_attempt_row(deploy, tmp_path, test_env):
    """An older worker meets a live newer worker's type on every burst: the job's history
    shows one `handed-off` attempt, not one per hand-back, and no attempt is spent."""
    app, env = deploy
    sender = make_sender(app)
    with _newer_worker(env, tmp_path) as newer:
        _wait_for(lambda: _published(app), "the newer worker's registration", newer)
        _freeze(newer, test_env["DATABASE_URL"])  # stopped, still within its heartbeat window
        assert deliver(app.test_client(), sender, "evt_back", "t.new",
                       {"amount": 3}).status_code == 202
        for _ in range(3):
            _wait_for(lambda: _due(app, "t.new"), "the handed-back job to be due again")
            _older_burst(env)
            assert _receipts(app, "t.new") == [("pending", None, 0)]
            assert _history(app, "t.new") == [(1, "handed-off")]
        newer.send_signal(signal.SIGCONT)
        _wait_for(lambda: _receipts(app, "t.new")[0][0] == "complete",
                  "the newer worker to complete t.new", newer)
    assert _history(app, "t.new") == [(1, "handed-off"), (2, "complete")]
