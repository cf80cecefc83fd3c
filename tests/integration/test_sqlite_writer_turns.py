"""SQLite's writers take turns (ledger.db.writer_turns): the ledger's transactions and the intake.

SQLite only: PostgreSQL has row locks and many writers, and its transactions take no turns.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger.db.writer_turns import turns_path
from tests.helpers import deliver, make_sender


@pytest.fixture
def sqlite_app(sqlite_template: Path, tmp_path: Path) -> Iterator[Any]:
    from app import create_app
    from tests.conftest import TEST_AUDIT_KEY, TEST_MASTER_KEY

    path = tmp_path / "ledger.sqlite3"
    shutil.copyfile(sqlite_template, path)
    application = create_app({
        "DATABASE_URL": f"sqlite:///{path}", "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
        "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY, "LEDGER_VAR_DIR": str(tmp_path),
        "LEDGER_SECRET_KEY": "test-secret-key", "LEDGER_DEMO_HANDLERS": "1"})
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
