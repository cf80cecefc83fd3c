"""SQLite's writers take turns (ledger.db.writer_turns): the ledger's transactions and the intake.

SQLite only: PostgreSQL has row locks and many writers, and its transactions take no turns.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger.db.writer_turns import MAX_WAIT_SECONDS, WriterTurns, turns_path
from tests.helpers import deliver, make_sender


@pytest.fixture
def sqlite_app(sqlite_template: Path, tmp_path: Path) -> Iterator[Any]:
    from app import create_app
    from tests.conftest import TEST_AUDIT_KEY, TEST_MASTER_KEY

    path = tmp_path / "ledger.sqlite3"
    shutil.copyfile(sqlite_template, path)
    # These tests are about the order of SQLite's writers, not durability: NORMAL keeps a
    # commit's fsync, whose time depends on what else the disk is doing, out of what they
    # time (a parallel run's database copies made one claim's commit take 0.28 s).
    application = create_app({
        "DATABASE_URL": f"sqlite:///{path}", "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
        "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY, "LEDGER_VAR_DIR": str(tmp_path),
        "LEDGER_SECRET_KEY": "test-secret-key", "LEDGER_DEMO_HANDLERS": "1",
        "LEDGER_SQLITE_SYNCHRONOUS": "NORMAL"})
    yield application
    application.extensions["ledger"].close()


def _taken(app: Any) -> bool:
    """Tell whether a writer holds the database's turn, asking from a file of our own."""
    fd = os.open(turns_path(str(app.extensions["ledger"].engine.url.database)),
                 os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_transaction_holds_the_writer_turn_until_it_commits_rolls_back_or_closes(sqlite_app):
    engine = sqlite_app.extensions["ledger"].engine
    assert not _taken(sqlite_app)
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))
        assert _taken(sqlite_app)
    assert not _taken(sqlite_app)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(text("SELECT 1"))
        raise RuntimeError("the block fails: its transaction rolls back")
    assert not _taken(sqlite_app)
    conn = engine.connect()
    conn.execute(text("SELECT 1"))  # autobegin
    assert _taken(sqlite_app)
    conn.close()  # closed with the transaction open: the pool rolls it back
    assert not _taken(sqlite_app)


def test_a_delivery_gets_in_between_the_transactions_of_a_busy_writer(sqlite_app):
    # A worker draining a backlog begins its next transaction the moment it commits. With
    # SQLite's busy handler alone the intake slept and retried while the worker took the
    # lock again (bench: p99 over a second); with turns the claim is next in line.
    engine = sqlite_app.extensions["ledger"].engine
    sender, client = make_sender(sqlite_app), sqlite_app.test_client()
    # The first delivery reads the integration and its keys; later ones claim, one turn.
    assert deliver(client, sender, "evt_first").status_code == 202
    stop, commits = threading.Event(), [0]

    def busy_writer() -> None:
        while not stop.is_set():
            with engine.begin() as conn:
                conn.execute(text("SELECT 1"))
                stop.wait(0.02)
            commits[0] += 1

    writer = threading.Thread(target=busy_writer)
    writer.start()
    try:
        while commits[0] < 3:  # the writer is in its stride
            stop.wait(0.01)
        before = commits[0]
        response = deliver(client, sender, "evt_between_turns")
        passed = commits[0] - before
    finally:
        stop.set()
        writer.join(10)
    assert response.status_code == 202
    assert passed <= 10, f"the claim waited out {passed} of the writer's transactions"


def _take_turn_and_stop(database: str, also_lock: bool, holding: Any) -> None:
    """Take the writer turn (and SQLite's write lock), then stop as Ctrl-Z stops a process."""
    WriterTurns(turns_path(database)).acquire()
    if also_lock:
        # The app's own writers finish first, however long the disk makes their commits.
        connection = sqlite3.connect(database, isolation_level=None, timeout=60)
        connection.execute("BEGIN IMMEDIATE")
    holding.set()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.fixture
def stopped_writer(sqlite_app: Any) -> Iterator[Any]:
    """Start a process of the same ledger that takes its turn and is then stopped."""
    database = str(sqlite_app.extensions["ledger"].engine.url.database)
    fork = multiprocessing.get_context("fork")
    started: list[Any] = []

    def start(also_lock: bool) -> Any:
        holding = fork.Event()
        child = fork.Process(target=_take_turn_and_stop, args=(database, also_lock, holding))
        child.start()
        started.append(child)
        assert holding.wait(10)
        deadline = time.monotonic() + 10
        while not _stopped(child.pid):
            assert time.monotonic() < deadline, "the writer did not stop"
            time.sleep(0.01)
        return child

    yield start
    for child in started:
        child.kill()
        child.join(10)


def test_a_stopped_process_holding_the_turn_delays_a_delivery_by_the_bound_only(
        sqlite_app, stopped_writer):
    # Stopped between its turn and its transaction (a worker suspended by Ctrl-Z): its own
    # watchdog cannot run, and SQLite's lock is free. Deliveries are still answered.
    sender, client = make_sender(sqlite_app), sqlite_app.test_client()
    assert deliver(client, sender, "evt_before_the_stop").status_code == 202
    stopped_writer(also_lock=False)
    asked = time.monotonic()
    assert deliver(client, sender, "evt_during_the_stop").status_code == 202
    assert time.monotonic() - asked < MAX_WAIT_SECONDS + 3
    asked = time.monotonic()
    assert deliver(client, sender, "evt_again_during_the_stop").status_code == 202
    assert time.monotonic() - asked < 1  # the process no longer waits for the stuck line
    assert deliver(client, sender, "evt_during_the_stop").get_json()["status"] == "duplicate"


def test_a_stopped_process_inside_its_transaction_gets_deliveries_answered_503(
        sqlite_app, stopped_writer):
    # Stopped inside its transaction: SQLite's lock is held too, so nothing can be written
    # until it runs again. The sender gets a 503 to retry within the busy timeout's bound,
    # and the retry is accepted once the process is gone.
    sender, client = make_sender(sqlite_app), sqlite_app.test_client()
    assert deliver(client, sender, "evt_before_the_stop").status_code == 202
    child = stopped_writer(also_lock=True)
    asked = time.monotonic()
    assert deliver(client, sender, "evt_during_the_stop").status_code == 503
    assert time.monotonic() - asked < MAX_WAIT_SECONDS + 10 + 3  # the turn, then busy_timeout
    child.kill()
    child.join(10)
    retried = deliver(client, sender, "evt_during_the_stop")
    assert retried.status_code == 202
    assert retried.get_json()["status"] == "accepted"  # the 503 had written nothing


def test_a_page_being_read_holds_up_no_delivery(sqlite_app):
    # The dashboard's and the API's reads are snapshots (ledger.db.engine.snapshot_engine):
    # they take no writer turn and no write lock, so a slow page does not stall the intake.
    from ledger.web.read_source import replica_read

    sender, client = make_sender(sqlite_app), sqlite_app.test_client()
    assert deliver(client, sender, "evt_before_the_read").status_code == 202
    reading, done, seen = threading.Event(), threading.Event(), []

    def slow_page(conn: Any) -> None:
        seen.append(conn.execute(text("SELECT count(*) FROM receipts")).scalar_one())
        reading.set()
        done.wait(10)
        seen.append(conn.execute(text("SELECT count(*) FROM receipts")).scalar_one())

    def read() -> None:
        with sqlite_app.test_request_context("/api/v1/receipts"):
            replica_read(slow_page)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert reading.wait(10)
        assert not _taken(sqlite_app)
        asked = time.monotonic()
        assert deliver(client, sender, "evt_during_the_read").status_code == 202
        assert time.monotonic() - asked < 1
    finally:
        done.set()
        reader.join(10)
    assert seen == [1, 1]  # one snapshot for the whole read
    with sqlite_app.test_request_context("/api/v1/receipts"):
        assert replica_read(lambda conn: conn.execute(
            text("SELECT count(*) FROM receipts")).scalar_one()) == 2  # the new receipt


def test_a_read_cannot_write(sqlite_app):
    from sqlalchemy.exc import OperationalError

    from ledger.web.read_source import replica_read

    with sqlite_app.test_request_context("/api/v1/receipts"), \
            pytest.raises(OperationalError, match="readonly"):
        replica_read(lambda conn: conn.execute(text("DELETE FROM receipts")))
