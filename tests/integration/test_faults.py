"""Surviving database faults with real processes on PostgreSQL (bounded, loopback only).

- the database stops mid-load (a private throwaway cluster; never the shared server);
- the pool runs dry under concurrency while the database is slowed by a held lock;
- a connection is killed (pg_terminate_backend) inside an intake and a worker transaction;
- a gunicorn worker is killed with SIGKILL under load.
In every case no acknowledged event is lost and redelivery converges on one receipt each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import requests
from sqlalchemy import create_engine, func, select, text

from app import create_app
from ledger.clock import FixedClock, unix
from ledger.db.schema import jobs, receipts, scheduler_runs
from ledger.demo.seed import balance
from ledger.reads.receipts import get_receipt
from ledger.worker.loop import STORAGE_RETRY_SECONDS, Worker, WorkerHooks, process_one
from tests.conftest import IN_CI
from tests.helpers import WAIT, deliver, make_sender, send
from tests.integration import pg_failover
from tests.integration.load import (
    REQUEST_TIMEOUT,
    Answer,
    LoadGenerator,
    post_delivery,
    redeliver_until_acknowledged,
)
from tests.integration.pg_cluster import ledger_env, migrate
from tests.servers import gunicorn_server, thread_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
UNAVAILABLE = {"error": "unavailable"}


def receipt_counts(url: str) -> Counter[str]:
    """Return how many receipts each event id has."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return Counter(conn.execute(select(receipts.c.event_id)).scalars())
    finally:
        engine.dispose()


def assert_converged(url: str, answers: list[Answer], redelivered: dict[str, int]) -> None:
    """Every acknowledged event is in the ledger; after redelivery each sent event has one."""
    counts = receipt_counts(url)
    sent = {a.event_id for a in answers}
    acked = {a.event_id for a in answers if a.status is not None and a.status < 300}
    assert acked, "the load generator got nothing acknowledged"
    missing = acked - set(counts)
    assert not missing, f"acknowledged but not in the ledger: {sorted(missing)[:5]}"
    assert set(redelivered) == sent - acked
    assert set(counts) == sent
    assert set(counts.values()) == {1}


def _sender(env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Create an integration through a short-lived app."""
    setup = create_app(env)
    try:
        return make_sender(setup)
    finally:
        setup.extensions["ledger"].close()


@pytest.fixture
def private_pg(private_cluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A migrated database on a throwaway cluster that this test may stop and start."""
    env = ledger_env(private_cluster.url("ledger"), tmp_path)
    migrate(env)
    return private_cluster, env


@contextmanager
def _worker_process(env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Run `ledger worker` for the duration of the block."""
    process = subprocess.Popen([str(BIN / "ledger"), "worker", "--concurrency", "2"],
                               cwd=str(ROOT), env={**os.environ, **env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=WAIT)


def _wait_for_no_jobs(url: str, worker: subprocess.Popen) -> None:
    """Wait (bounded) until the worker finished every job."""
    engine = create_engine(url)
    deadline = time.monotonic() + 2 * WAIT
    try:
        while time.monotonic() < deadline:
            assert worker.poll() is None, "the worker died with the database"
            with engine.connect() as conn:
                left = conn.execute(select(func.count()).select_from(jobs)).scalar()
                open_receipts = conn.execute(select(func.count()).select_from(receipts)
                                             .where(receipts.c.state != 1)).scalar()
            if left == 0 and open_receipts == 0:
                return
            time.sleep(0.5)
    finally:
        engine.dispose()
    raise AssertionError(f"{left} jobs still queued after the database came back")


def _readyz(base_url: str) -> int | None:
    """Return /readyz's status, or None if it did not answer."""
    try:
        return requests.get(f"{base_url}/readyz", timeout=REQUEST_TIMEOUT).status_code
    except requests.RequestException:
        return None


def test_database_down_mid_load_answers_503_then_recovers_losing_nothing(private_pg):
    """Stop PostgreSQL under load: bounded 503s with Retry-After, then recovery by itself."""
    cluster, env = private_pg
    env = {**env, "LEDGER_DB_POOL_TIMEOUT_MS": "1000", "LEDGER_DB_STATEMENT_TIMEOUT_MS": "3000"}
    sender = _sender(env)
    with gunicorn_server({**os.environ, **env}, workers=2) as (base_url, _process), \
            _worker_process(env) as worker:
        load = LoadGenerator(base_url, sender, prefix="down").start()
        try:
            load.wait_for(lambda a: sum(x.status == 202 for x in a) >= 20, WAIT, "first acks")
            cluster.stop()
            load.wait_for(lambda a: any(x.status == 503 for x in a), WAIT, "a 503")
            assert _readyz(base_url) == 503
            # Keep the database away until several requests were refused (a condition,
            # not a sleep: a loaded machine sends fewer requests in the same time).
            down = len(load.answers)
            load.wait_for(lambda a: sum(x.status == 503 for x in a[down:]) >= 5, WAIT,
                          "refusals while the database is away")
            cluster.start()
            restarted = len(load.answers)
            load.wait_for(lambda a: sum(x.status == 202 for x in a[restarted:]) >= 20, WAIT,
                          "recovery without a restart of the web processes")
            assert _readyz(base_url) == 200
        finally:
            answers = load.stop()
        failed = sorted({a.event_id for a in answers if a.status != 202})
        redelivered = redeliver_until_acknowledged(base_url, sender, failed)
        # The worker lived through the outage too: it finishes every job by itself.
        _wait_for_no_jobs(env["DATABASE_URL"], worker)
    hung = [a for a in answers if a.status is None]
    assert not hung, f"requests that never got an answer: {hung[:3]}"
    assert {a.status for a in answers} == {202, 503}
    refusals = [a for a in answers if a.status == 503]
    assert all(a.body == UNAVAILABLE and a.retry_after for a in refusals)
    assert max(a.seconds for a in answers) < REQUEST_TIMEOUT
    assert_converged(env["DATABASE_URL"], answers, redelivered)


class _OutageWaits(threading.Event):
    """A worker's stop event that records each wait the worker chooses during an outage."""

    def __init__(self) -> None:
        super().__init__()
        self.outage = threading.Event()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        """Record the wait while the outage is on, then wait as an Event does."""
        if self.outage.is_set():
            self.waits.append(timeout)
        return super().wait(timeout)


def _state_within(svc, sender, event_id: str, want: str) -> str:  # type: ignore[no-untyped-def]
    """Poll the receipt's state until it is `want` (bounded by WAIT); return the last seen."""
    deadline, state = time.monotonic() + WAIT, ""
    while state != want and time.monotonic() < deadline:
        with svc.engine.connect() as conn:
            found = get_receipt(conn, sender.scope, event_id)
            state = found.state.value if found else ""
        time.sleep(0.05)
    return state


def test_a_worker_keeps_its_storage_pace_while_the_database_is_away(private_pg):
    """PostgreSQL away for 8 s: every wait the worker chooses stays at its storage pace
    (a worker backing off exponentially would wait seconds more), so it resumes within
    about a second; an event accepted once the server is back is completed."""
    cluster, env = private_pg
    sender = _sender(env)
    app = create_app(env)
    svc = app.extensions["ledger"]
    stop = _OutageWaits()
    # Idle polls of 0.1 s stay under the bound, so only an error backoff could exceed it.
    thread = threading.Thread(target=Worker(svc, worker_id="w-outage").run,
                              kwargs={"stop": stop, "poll_seconds": 0.1}, daemon=True)
    thread.start()
    try:
        send(app, sender, "before", data={"amount": 1}, expect=202)
        assert _state_within(svc, sender, "before", "complete") == "complete"
        cluster.stop()
        stop.outage.set()
        time.sleep(8)  # real time for an exponential backoff to grow past the bound
        cluster.start()
        stop.outage.clear()
        send(app, sender, "after", data={"amount": 2}, expect=202)
        assert _state_within(svc, sender, "after", "complete") == "complete"
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(WAIT)
        svc.close()
    assert stop.waits, "the worker never retried while the database was away"
    assert max(w or 0.0 for w in stop.waits) <= STORAGE_RETRY_SECONDS * 1.5


@pytest.fixture
def pg_env(pg_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for ledger processes on a fresh database of the shared server."""
    return ledger_env(pg_url, tmp_path)


@pytest.fixture
def admin(pg_url: str):  # type: ignore[no-untyped-def]
    """A separate engine on the test database, for holding locks and killing backends."""
    engine = create_engine(pg_url)
    yield engine
    engine.dispose()


def _concurrent(base_url: str, sender, event_ids: list[str]) -> list[Answer]:  # type: ignore[no-untyped-def]
    """Send the deliveries all at once, one thread each."""
    def send(event_id: str) -> Answer:
        return post_delivery(requests.Session(), base_url, sender, event_id)

    with ThreadPoolExecutor(max_workers=len(event_ids)) as pool:
        return list(pool.map(send, event_ids))


def test_pool_exhaustion_answers_503_fast_and_recovers(pg_env, admin):
    """A pool of 2 under 20 concurrent requests on a stalled table: 503s, no hang, recovery."""
    app = create_app({**pg_env, "LEDGER_DB_POOL_SIZE": "2", "LEDGER_DB_POOL_TIMEOUT_MS": "500",
                      "LEDGER_DB_LOCK_TIMEOUT_MS": "4000"})
    sender = make_sender(app)
    try:
        with thread_server(app) as base_url:
            assert _concurrent(base_url, sender, ["warm"])[0].status == 202
            with admin.begin() as conn:  # every intake transaction now waits on this lock
                conn.execute(text("LOCK TABLE receipts IN ACCESS EXCLUSIVE MODE"))
                stalled = _concurrent(base_url, sender, [f"stall-{i}" for i in range(20)])
            recovered = _concurrent(base_url, sender, [f"stall-{i}" for i in range(20)])
    finally:
        app.extensions["ledger"].close()
    assert {a.status for a in stalled} == {503}
    assert all(a.body == UNAVAILABLE and a.retry_after for a in stalled)
    # Bounded by the lock timeout (4 s) for the two holding connections and by the
    # pool timeout (0.5 s) for the other 18: they do not queue behind the holders.
    assert max(a.seconds for a in stalled) < 4 + 3
    assert sorted(a.seconds for a in stalled)[9] < 3
    assert {a.status for a in recovered} == {202}
    assert receipt_counts(pg_env["DATABASE_URL"]) == Counter(
        {"warm": 1, **{f"stall-{i}": 1 for i in range(20)}})


def _backend_waiting_on(admin, statement_part: str) -> int:  # type: ignore[no-untyped-def]
    """Return the pid of our database's backend blocked on a lock in a statement like this."""
    deadline = time.monotonic() + WAIT
    query = text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                 "AND wait_event_type = 'Lock' AND query ILIKE :part")
    while time.monotonic() < deadline:
        with admin.connect() as conn:
            pid = conn.execute(query, {"part": f"%{statement_part}%"}).scalar()
        if pid is not None:
            return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"no backend blocked in {statement_part!r}")


def test_connection_killed_inside_an_intake_transaction(pg_env, admin):
    """The receipt is written, the job insert waits on a lock, the backend is killed.

    (On PostgreSQL both inserts may be one statement; either way nothing may stay.)
    """
    app = create_app({**pg_env, "LEDGER_DB_LOCK_TIMEOUT_MS": "20000"})
    sender = make_sender(app)
    try:
        with thread_server(app) as base_url:
            assert _concurrent(base_url, sender, ["warm"])[0].status == 202
            with ThreadPoolExecutor(max_workers=1) as pool:
                with admin.begin() as conn:
                    conn.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
                    pending = pool.submit(_concurrent, base_url, sender, ["cut"])
                    victim = _backend_waiting_on(admin, "INSERT INTO jobs")
                    with admin.connect() as killer:
                        killer.execute(text("SELECT pg_terminate_backend(:pid)"),
                                       {"pid": victim})
                first = pending.result(timeout=WAIT)[0]
            assert first.status == 503 and first.retry_after
            with app.extensions["ledger"].engine.connect() as conn:
                left = conn.execute(select(func.count()).select_from(receipts)
                                    .where(receipts.c.event_id == "cut")).scalar()
            assert left == 0, "the killed transaction left a receipt without its job"
            retried = _concurrent(base_url, sender, ["cut"])[0]
    finally:
        app.extensions["ledger"].close()
    assert retried.status == 202 and retried.body["status"] == "accepted"
    with admin.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)
                            .where(jobs.c.event_id == "cut")).scalar() == 1
    assert receipt_counts(pg_env["DATABASE_URL"]) == Counter({"warm": 1, "cut": 1})


def _state_and_balance(engine, sender) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """Return the receipt state of evt_k and the scope's demo balance."""
    with engine.connect() as conn:
        return (get_receipt(conn, sender.scope, "evt_k").state.value,
                balance(conn, sender.scope_id))


def test_connection_killed_inside_a_worker_transaction(pg_env, admin):
    """The completion's backend dies before commit: no effect, and the retry credits once."""
    app = create_app(pg_env, clock=FixedClock(datetime.now(UTC)))
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    killed: list[int] = []

    def kill_own_backend(conn, _event) -> None:  # type: ignore[no-untyped-def]
        if not killed:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            with admin.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            killed.append(pid)

    try:
        answer = deliver(app.test_client(), sender, "evt_k", data={"amount": 5},
                         timestamp=unix(svc.clock.now()))
        assert answer.status_code == 202
        assert process_one(svc, "w-killed", hooks=WorkerHooks(before_commit=kill_own_backend))
        assert killed
        assert _state_and_balance(svc.engine, sender) == ("pending", 0)
        svc.clock.advance(svc.settings.retry_cap_seconds)
        assert process_one(svc, "w-retry")
        assert _state_and_balance(svc.engine, sender) == ("complete", 5)
        again = deliver(app.test_client(), sender, "evt_k", data={"amount": 5},
                        timestamp=unix(svc.clock.now()))
        assert again.status_code == 200 and again.get_json()["state"] == "complete"
    finally:
        svc.close()


def test_connection_lost_before_the_completion_statement(pg_env, admin):
    """The handler wrote, then the backend died: the completion (run on the driver
    connection) fails as a storage error without parameters, nothing commits, the broken
    connection is not reused, and the retry credits once."""
    from ledger.demo.handlers import credit
    from ledger.worker.handlers import Registry

    app = create_app(pg_env, clock=FixedClock(datetime.now(UTC)))
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    killed: list[int] = []

    def credit_then_lose_the_connection(conn, event):  # type: ignore[no-untyped-def]
        ref = credit(conn, event)
        if not killed:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            with admin.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            killed.append(pid)
        return ref

    registry = Registry.of({"demo.credit": credit_then_lose_the_connection})
    try:
        answer = deliver(app.test_client(), sender, "evt_k", data={"amount": 5},
                         timestamp=unix(svc.clock.now()))
        assert answer.status_code == 202
        assert process_one(svc, "w-cut", handlers=registry)
        assert killed
        assert _state_and_balance(svc.engine, sender) == ("pending", 0)
        with svc.engine.connect() as conn:
            (outcome, error), = conn.execute(text(
                "SELECT outcome, error FROM attempts WHERE event_id = 'evt_k'")).all()
        assert outcome == "interrupted"  # the database's fault: no attempt spent
        assert error == "AdminShutdown: terminating connection due to administrator command"
        with svc.engine.connect() as conn:
            assert conn.execute(select(jobs.c.attempts)).scalar() == 0
        svc.clock.advance(svc.settings.retry_cap_seconds)
        assert process_one(svc, "w-retry", handlers=registry)
        assert _state_and_balance(svc.engine, sender) == ("complete", 5)
    finally:
        svc.close()


def _kill_every_backend_but_ours(admin) -> int:  # type: ignore[no-untyped-def]
    """Terminate every other connection to the test database; return how many."""
    with admin.connect() as conn:
        return len(conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")).all())


def test_connections_killed_while_a_handler_sleeps_spend_no_attempt(pg_env, admin):
    """The chaos drill's case: LEDGER_MAX_ATTEMPTS=2, the worker loop's connection killed
    twice while the handler's prepare step slept. The event completes and credits once."""
    from ledger.demo.handlers import credit
    from ledger.worker.handlers import HandlerSpec, Registry
    from ledger.worker.loop import Worker

    app = create_app({**pg_env, "LEDGER_MAX_ATTEMPTS": "2"})
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    kills: list[int] = []

    def sleep_through_a_kill(event):  # type: ignore[no-untyped-def]
        if len(kills) < 2:  # the loop's idle connection dies while the handler waits
            kills.append(_kill_every_backend_but_ours(admin))
            time.sleep(0.2)

    registry = Registry({"demo.slow": HandlerSpec(event_type="demo.slow", apply=credit,
                                                  prepare=sleep_through_a_kill)})
    try:
        answer = deliver(app.test_client(), sender, "evt_s", "demo.slow", {"amount": 5},
                         timestamp=unix(svc.clock.now()))
        assert answer.status_code == 202
        # rng 0: an interrupted attempt is due again at once, so a burst run sees it.
        Worker(svc, handlers=registry, rng=_Zero()).run(burst=True)
        assert len(kills) == 2 and all(kills)
        assert _state_and_balance_of(svc.engine, sender, "evt_s") == ("complete", 5)
        with svc.engine.connect() as conn:
            outcomes = conn.execute(text("SELECT outcome FROM attempts WHERE event_id = "
                                         "'evt_s' ORDER BY number")).scalars().all()
        assert outcomes == ["interrupted", "interrupted", "complete"]
        again = deliver(app.test_client(), sender, "evt_s", "demo.slow", {"amount": 5},
                        timestamp=unix(svc.clock.now()))
        assert (again.status_code, again.get_json()["state"]) == (200, "complete")
    finally:
        svc.close()


class _Zero:
    """An RNG whose full-jitter waits are all zero."""

    def random(self) -> float:
        """Return 0."""
        return 0.0


def _state_and_balance_of(engine, sender, event_id: str) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """Return an event's receipt state and the scope's demo balance."""
    with engine.connect() as conn:
        return (get_receipt(conn, sender.scope, event_id).state.value,
                balance(conn, sender.scope_id))


def test_pooled_connections_killed_while_idle_cost_no_request(pg_env, admin):
    """Kill every pooled connection of a serving app: the next requests are all accepted
    (the pool checks a connection before handing it out), none answers 503."""
    app = create_app({**pg_env, "LEDGER_DB_POOL_SIZE": "8"})
    sender = make_sender(app)
    try:
        with thread_server(app) as base_url:
            warm = _concurrent(base_url, sender, [f"warm-{i}" for i in range(8)])
            assert {a.status for a in warm} == {202}
            # The claims ran on their threads' own connections, which close with the
            # development server's threads: hold two of the pool's at once, so that at
            # least two sit idle in it, whatever the requests above happened to overlap.
            engine = app.extensions["ledger"].engine
            with engine.connect(), engine.connect():
                pass
            assert _kill_every_backend_but_ours(admin) >= 2
            time.sleep(0.2)  # the backends are gone
            after = _concurrent(base_url, sender, [f"after-{i}" for i in range(20)])
            later = _concurrent(base_url, sender, ["later"])
    finally:
        app.extensions["ledger"].close()
    assert [a.status for a in after] == [202] * 20
    assert later[0].status == 202
    assert receipt_counts(pg_env["DATABASE_URL"]) == Counter(
        {**{f"warm-{i}": 1 for i in range(8)}, **{f"after-{i}": 1 for i in range(20)},
         "later": 1})


def _worker_pids(master: int) -> list[int]:
    """Return the pids of a gunicorn master's workers."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def test_killing_a_gunicorn_worker_under_load_loses_no_acknowledged_event(pg_env):
    """SIGKILL one web process mid-load: every 2xx is in the ledger, the rest converge."""
    sender = _sender(pg_env)
    with gunicorn_server({**os.environ, **pg_env}, workers=2) as (base_url, process):
        load = LoadGenerator(base_url, sender, prefix="kill", threads=6, pause=0).start()
        try:
            load.wait_for(lambda a: sum(x.status == 202 for x in a) >= 40, WAIT, "first acks")
            victim = _worker_pids(process.pid)[0]
            os.kill(victim, signal.SIGKILL)
            after = len(load.answers)
            load.wait_for(lambda a: sum(x.status == 202 for x in a[after:]) >= 60, WAIT,
                          "acks after the kill")
        finally:
            answers = load.stop()
        deadline = time.monotonic() + WAIT
        while len(_worker_pids(process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim not in _worker_pids(process.pid)
        assert len(_worker_pids(process.pid)) == 2, "the master replaced the dead worker"
        failed = sorted({a.event_id for a in answers if a.status != 202})
        redelivered = redeliver_until_acknowledged(base_url, sender, failed)
    assert {a.status for a in answers} <= {202, 503, None}
    assert_converged(pg_env["DATABASE_URL"], answers, redelivered)


def test_pgbouncer_mode_relies_on_no_session_state(pg_url, tmp_path):
    """LEDGER_DB_PGBOUNCER=1: no startup options, no server-side prepared statements."""
    from ledger.config import Settings
    from ledger.db.engine import make_engine

    plain = make_engine(Settings.from_env({"DATABASE_URL": pg_url}))
    pooled = make_engine(Settings.from_env({"DATABASE_URL": pg_url, "LEDGER_DB_PGBOUNCER": "1"}))
    try:
        with plain.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "5s"
        with pooled.connect() as conn:
            assert conn.connection.dbapi_connection.prepare_threshold is None
            for _ in range(8):  # psycopg would prepare after 5 executions
                conn.execute(select(func.count()).select_from(receipts))
            prepared = conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements")
            assert prepared.scalar() == 0
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
    finally:
        plain.dispose()
        pooled.dispose()


@pytest.fixture
def failover_formation(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A migrated ledger on a private pg_auto_failover formation, reached by a multi-host
    URL with target_session_attrs=read-write; fails in CI when it cannot be built."""
    missing = pg_failover.available()
    if missing is not None:
        if IN_CI:
            pytest.fail(f"CI=true and {missing} (scripts/system-deps.sh installs it)",
                        pytrace=False)
        pytest.skip(f"{missing}: the failover test is SKIPPED on this machine")
    formation = pg_failover.Formation()
    try:
        formation.start()
        assert formation.sync_standby_names() != "", "the standby must be synchronous"
        with psycopg.connect(host="127.0.0.1", port=formation.primary_port(), user="postgres",
                             dbname="postgres", autocommit=True) as conn:
            # pg_autoctl's initdb made SQL_ASCII clusters; the ledger's text is UTF-8
            conn.execute("CREATE DATABASE ledger ENCODING 'UTF8' TEMPLATE template0")
        env = ledger_env(formation.url("ledger"), tmp_path, LEDGER_DB_POOL_TIMEOUT_MS="1000",
                         LEDGER_DB_STATEMENT_TIMEOUT_MS="3000",
                         LEDGER_SCHEDULER_PERIODS="sweep=1,rollups=1")
        done = subprocess.run([str(BIN / "ledger"), "db", "upgrade"], cwd=str(ROOT),
                              env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=WAIT, check=False)
        assert done.returncode == 0, done.stderr
        yield formation, env
    finally:
        formation.drop()


def _scheduler_ran_since(url: str, since: datetime) -> bool:
    """Tell whether a scheduled run that started after `since` finished ok."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(select(func.count()).select_from(scheduler_runs).where(
                scheduler_runs.c.started_at > since,
                scheduler_runs.c.outcome == "ok")).scalar())
    except Exception:  # the writer is still being elected
        return False
    finally:
        engine.dispose()


def test_losing_the_primary_under_load_loses_no_acknowledged_event(failover_formation):
    """kill -9 of the primary (keeper and PostgreSQL) under intake, worker and scheduler
    load: the standby is promoted, every process reconnects through the multi-host URL by
    itself, every 2xx is in the ledger, and redelivery ends with one receipt and one
    effect per event."""
    formation, env = failover_formation
    sender = _sender(env)
    scheduler = subprocess.Popen([str(BIN / "ledger"), "scheduler"], cwd=str(ROOT),
                                 env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with gunicorn_server({**os.environ, **env}, workers=2) as (base_url, web), \
                _worker_process(env) as worker:
            load = LoadGenerator(base_url, sender, prefix="fo").start()
            try:
                load.wait_for(lambda a: sum(x.status == 202 for x in a) >= 30, WAIT,
                              "first acks")
                killed_port = formation.kill_primary()
                killed, killed_at = time.monotonic(), datetime.now(UTC)
                cut = len(load.answers)
                load.wait_for(lambda a: any(x.status != 202 for x in a[cut:]), WAIT,
                              "the outage")
                outage = cut + next(i for i, x in enumerate(load.answers[cut:])
                                    if x.status != 202)
                load.wait_for(lambda a: any(x.status == 202 for x in a[outage:]), 3 * WAIT,
                              "an ack from the new primary")
                recovered = time.monotonic() - killed
                load.wait_for(lambda a: sum(x.status == 202 for x in a[cut:]) >= 30, WAIT,
                              "steady acks after the failover")
            finally:
                answers = load.stop()
            assert formation.primary_port() != killed_port
            failed = sorted({a.event_id for a in answers if a.status != 202})
            redelivered = redeliver_until_acknowledged(base_url, sender, failed)
            _wait_for_no_jobs(env["DATABASE_URL"], worker)  # the worker recovered by itself
            deadline = time.monotonic() + WAIT
            while not _scheduler_ran_since(env["DATABASE_URL"], killed_at):
                assert time.monotonic() < deadline, "the scheduler did not recover"
                assert scheduler.poll() is None, "the scheduler died with the primary"
                time.sleep(0.5)
            assert web.poll() is None and worker.poll() is None
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=WAIT)
    print(f"\nfailover: first 2xx {recovered:.1f} s after kill -9 of the primary; "
          f"{sum(a.status != 202 for a in answers)} of {len(answers)} deliveries refused")
    assert {a.status for a in answers} <= {202, 503}
    assert_converged(env["DATABASE_URL"], answers, redelivered)
    engine = create_engine(env["DATABASE_URL"])
    try:
        with engine.connect() as conn:  # one business effect per event (amount 1 each)
            assert balance(conn, sender.scope_id) == len({a.event_id for a in answers})
    finally:
        engine.dispose()
