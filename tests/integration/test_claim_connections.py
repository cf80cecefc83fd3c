"""The intake claim's connections of the threads' own (ledger.db.driver.ThreadConnections).

PostgreSQL only: SQLite claims through its group commit, on the pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from app import create_app
from ledger.config import Settings
from ledger.db.driver import ThreadConnections
from ledger.db.engine import make_engine
from tests.conftest import TEST_MASTER_KEY
from tests.helpers import make_sender, send
from tests.integration.pg_cluster import ledger_env


@pytest.fixture
def engine(pg_url: str, tmp_path: Path) -> Iterator[Engine]:
    """An engine whose pool holds 2 connections."""
    settings = Settings(database_url=pg_url, var_dir=tmp_path, master_key=TEST_MASTER_KEY,
                        pool_size=2)
    engine = make_engine(settings)
    yield engine
    engine.dispose()


def backend(cursor: Any) -> tuple[int, bool]:
    """Return the server process serving `cursor`'s connection, and whether it is in
    autocommit."""
    return cursor.execute("SELECT pg_backend_pid()").fetchone()[0], cursor.connection.autocommit


def alive(engine: Engine, pids: set[int], *, wait: bool = True) -> set[int]:
    """Return which of these server processes are still connected (waiting up to 5 s for
    none: a closed connection's server process leaves a moment after the close)."""
    deadline = time.monotonic() + 5
    while True:
        with engine.connect() as conn:
            left = {int(pid) for pid in conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE pid = ANY(:pids)"),
                {"pids": list(pids)}).scalars()}
        if not left or not wait or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_a_thread_keeps_one_connection_in_autocommit_outside_the_pool(engine: Engine) -> None:
    own = ThreadConnections(engine, limit=2)
    try:
        first = own.run(backend, what="claim")
        assert own.run(backend, what="claim") == first  # the same server process
        assert first[1] is True  # each statement is its own transaction
        assert len(own) == 1
        assert engine.pool.checkedout() == 0  # the pool's connections stay free
    finally:
        own.close()


def test_a_thread_runs_its_statements_on_one_cursor_of_its_connection(engine: Engine) -> None:
    own = ThreadConnections(engine, limit=2)
    seen: list[Any] = []

    def on_cursor(cursor: Any) -> tuple[int, bool]:
        seen.append(cursor)
        return cursor.execute("SELECT pg_backend_pid()").fetchone()[0], \
            cursor.connection.autocommit

    try:
        first = own.run(on_cursor, what="claim")
        assert own.run(on_cursor, what="claim") == first
        assert first[1] is True
        assert seen[0] is seen[1] and not seen[0].closed  # kept, not reopened
        with pytest.raises(DBAPIError):
            own.run(lambda c: c.execute("SELECT 1 / 0").fetchone(), what="claim")
        # The failed statement's connection is closed; the next one has its own cursor.
        assert own.run(on_cursor, what="claim")[0] != first[0]
        assert seen[-1] is not seen[0] and seen[0].connection.closed
    finally:
        own.close()


def test_a_thread_without_a_place_runs_on_a_pooled_cursor_it_closes(engine: Engine) -> None:
    own = ThreadConnections(engine, limit=0)  # no places: every statement on the pool
    seen: list[Any] = []

    def on_cursor(cursor: Any) -> bool:
        seen.append(cursor)
        return bool(cursor.connection.autocommit)

    try:
        assert own.run(on_cursor, what="claim") is True
        assert len(own) == 0 and seen[0].closed
        assert engine.pool.checkedout() == 0
        with engine.connect() as conn:  # back in the pool out of autocommit
            assert conn.connection.driver_connection.autocommit is False
    finally:
        own.close()


def test_a_connection_the_server_closed_is_replaced_before_use(engine: Engine) -> None:
    own = ThreadConnections(engine, limit=2)
    try:
        pid, _ = own.run(backend, what="claim")
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            conn.commit()
            deadline = time.monotonic() + 5
            while conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                               {"pid": pid}).scalar_one() and time.monotonic() < deadline:
                time.sleep(0.02)
        # The server has closed it: no error for the claim, the closed connection is seen
        # before it is used.
        again, _ = own.run(backend, what="claim")
        assert again != pid
        assert len(own) == 1
    finally:
        own.close()


def test_after_a_driver_error_the_next_statement_opens_another_connection(
        engine: Engine) -> None:
    own = ThreadConnections(engine, limit=2)
    try:
        pid, _ = own.run(backend, what="claim")
        with pytest.raises(DBAPIError):  # raised as SQLAlchemy's, as the ledger handles it
            own.run(lambda c: c.execute("SELECT 1 / 0").fetchone(), what="claim")
        assert len(own) == 0
        assert own.run(backend, what="claim")[0] != pid
    finally:
        own.close()


def test_threads_beyond_the_limit_claim_on_a_pooled_connection(engine: Engine) -> None:
    own = ThreadConnections(engine, limit=2)
    holding, release = threading.Barrier(4), threading.Event()
    results: list[tuple[int, bool]] = []
    failures: list[BaseException] = []

    def held(cursor: Any) -> tuple[int, bool]:
        holding.wait(timeout=10)  # all three threads hold a connection at once
        release.wait(timeout=10)
        return backend(cursor)

    def claim() -> None:
        try:
            results.append(own.run(held, what="claim"))
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=claim) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        holding.wait(timeout=10)
        assert len(own) == 2  # the third thread is on a pooled connection
        assert engine.pool.checkedout() == 1
        release.set()
        for thread in threads:
            thread.join(timeout=20)
        assert not failures
        assert len({pid for pid, _ in results}) == 3
        assert all(autocommit for _, autocommit in results)
        assert engine.pool.checkedout() == 0  # given back
        with engine.connect() as conn:  # the pooled connection left autocommit
            assert conn.connection.driver_connection.autocommit is False
    finally:
        release.set()
        own.close()


def test_a_thread_that_ends_gives_its_connection_back(engine: Engine) -> None:
    # A development server runs each request on a thread of its own.
    own = ThreadConnections(engine, limit=2)
    try:
        ended: set[int] = set()
        for _ in range(5):  # more threads than places: each one's place comes back
            thread = threading.Thread(
                target=lambda: ended.add(own.run(backend, what="claim")[0]))
            thread.start()
            thread.join(timeout=20)
            deadline = time.monotonic() + 5
            while len(own) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(own) == 0
        assert len(ended) == 5
        assert alive(engine, ended) == set()  # each ended thread's connection was closed
        assert own.run(backend, what="claim")[1] is True  # a place is free: its own
        assert len(own) == 1
    finally:
        own.close()


def test_close_ends_every_thread_connection(engine: Engine) -> None:
    own = ThreadConnections(engine, limit=2)
    claimed, stop = threading.Barrier(3), threading.Event()
    pids: set[int] = set()

    def claim_and_stay() -> None:
        pids.add(own.run(backend, what="claim")[0])
        claimed.wait(timeout=10)
        stop.wait(timeout=20)  # the thread lives on, as a server's threads do

    threads = [threading.Thread(target=claim_and_stay) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        claimed.wait(timeout=10)
        assert len(own) == 2
        assert alive(engine, pids, wait=False) == pids
        own.close()
        assert len(own) == 0
        assert alive(engine, pids) == set()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=20)


def test_the_app_claims_on_its_own_connection_and_closes_it_when_it_stops(
        pg_url: str, tmp_path: Path) -> None:
    app = create_app(ledger_env(pg_url, tmp_path))
    services = app.extensions["ledger"]
    sender = make_sender(app)
    try:
        send(app, sender, "evt_own_1", expect=202)
        again = send(app, sender, "evt_own_1")
        assert again.get_json()["status"] == "duplicate"  # answered as recorded
    finally:
        services.close()
    # Nothing of the app's is left connected: the claim's own connection is outside the
    # pool, so only the intake's close ends it.
    engine = create_engine(pg_url, poolclass=NullPool)  # one connection: the one asking
    deadline = time.monotonic() + 5
    while True:
        with engine.connect() as conn:
            others = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()")).scalar_one()
        if others == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert others == 0



@pytest.mark.parametrize(("setting", "outside_the_pool"), [(None, True), ("1", True),
                                                            ("0", False)])
def test_claim_connections_sets_whether_claims_run_outside_the_pool(
        pg_url: str, tmp_path: Path, setting: str | None, outside_the_pool: bool) -> None:
    # LEDGER_DB_CLAIM_CONNECTIONS: unset or 1, a thread claims on a connection of its own,
    # one more to the server; 0, every claim runs on a pooled connection.
    extra = {} if setting is None else {"LEDGER_DB_CLAIM_CONNECTIONS": setting}
    app = create_app(ledger_env(pg_url, tmp_path, **extra))
    services = app.extensions["ledger"]
    sender = make_sender(app)
    try:
        for n in range(3):
            send(app, sender, f"evt_budget_{n}", expect=202)
        assert send(app, sender, "evt_budget_0").get_json()["status"] == "duplicate"
        with ExitStack() as held:  # every connection the pool can give, at once
            pooled = {held.enter_context(services.engine.connect()).execute(
                text("SELECT pg_backend_pid()")).scalar_one()
                for _ in range(services.engine.pool.size())}
            connected = set(held.enter_context(create_engine(pg_url, poolclass=NullPool)
                                               .connect()).execute(text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()")).scalars())
        # The one connection besides the pool's is the claim's own.
        assert len(connected - pooled) == (1 if outside_the_pool else 0)
    finally:
        services.close()
