"""Outages the ledger must answer for itself: bounded, honest, and caught up afterwards.

- behind PgBouncer (the shipped deploy/pgbouncer.ini bounds), a database that goes
  away answers 503 within the ledger's bounds, never a 15 s wait inside PgBouncer;
- a stall before the body is read is the server's: 503, never a 408 that blames the sender;
- /readyz sees commits that hang (a synchronous standby gone), not only a dead server;
- a scheduled job whose firing met an outage runs once the database is back, in its period.

Each test runs a private, throwaway cluster (never the shared server).
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, select, text

from app import create_app
from ledger.clock import FixedClock
from ledger.db.schema import scheduler_runs
from ledger.scheduling import runs
from ledger.scheduling.runner import ScheduledJob, period_start, run_once
from tests.helpers import WAIT, make_sender
from tests.integration.load import post_delivery
from tests.integration.pg_cluster import ledger_env, migrate
from tests.integration.pgbouncer import PrivatePgBouncer
from tests.servers import thread_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
# Pool wait (2 s) + connect (3 s) + PgBouncer's query_wait_timeout (2 s, checked once a
# second) + this machine's scheduling: well under PgBouncer's default 15 s retry wait.
BOUNDED = 10.0


def test_behind_pgbouncer_a_database_gone_answers_503_within_the_bounds(private_cluster, tmp_path):
    """PostgreSQL stops behind PgBouncer: deliveries get 503 + Retry-After in seconds,
    also for an integration not yet cached, whose look-up stalls before the body is read
    (a 1 s body deadline must not turn that stall into a 408)."""
    bouncer = PrivatePgBouncer(private_cluster.admin_url)
    bouncer.start()
    try:
        env = ledger_env(bouncer.url("ledger"), tmp_path, LEDGER_DB_PGBOUNCER="1",
                         LEDGER_BODY_READ_TIMEOUT_SECONDS="1")
        migrate(env)
        app = create_app(env)
        try:
            cached = make_sender(app, name="cached")
            uncached = make_sender(app, name="uncached")
            with thread_server(app) as base_url, requests.Session() as session:
                assert post_delivery(session, base_url, cached, "evt_before").status == 202
                private_cluster.stop()
                answers = [post_delivery(session, base_url, sender, f"evt_down_{n}")
                           for n, sender in enumerate((cached, uncached))]
                for answer in answers:
                    assert answer.status == 503, answer
                    assert answer.body == {"error": "unavailable"}
                    assert answer.retry_after
                    assert answer.seconds < BOUNDED, answer
                private_cluster.start()
                deadline = time.monotonic() + WAIT
                while time.monotonic() < deadline:
                    if post_delivery(session, base_url, uncached, "evt_after").status == 202:
                        break
                    time.sleep(0.5)
                else:
                    raise AssertionError("the intake did not recover behind PgBouncer")
        finally:
            app.extensions["ledger"].close()
    finally:
        bouncer.stop()


def test_readyz_sees_commits_stall_when_the_synchronous_standby_is_gone(private_cluster, tmp_path):
    """`SELECT 1` still answers while every commit waits for a standby that is not there:
    /readyz must say unready then, and ready again once commits go through."""
    env = ledger_env(private_cluster.url("ledger"), tmp_path)
    migrate(env)
    app = create_app(env)
    admin = create_engine(private_cluster.admin_url, isolation_level="AUTOCOMMIT")

    def standby_names(value: str) -> None:
        with admin.connect() as conn:
            conn.execute(text(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'"))
            conn.execute(text("SELECT pg_reload_conf()"))
        time.sleep(0.5)  # the reload reaches the backends at their next command

    try:
        client = app.test_client()
        assert client.get("/readyz").status_code == 200
        standby_names("ghost_standby")
        started = time.monotonic()
        stalled = client.get("/readyz")
        assert stalled.status_code == 503
        assert stalled.get_json()["status"] == "unready"
        assert "synchronous standby" in stalled.get_json()["detail"]
        assert time.monotonic() - started < BOUNDED
        standby_names("")
        assert client.get("/readyz").status_code == 200
    finally:
        standby_names("")
        admin.dispose()
        app.extensions["ledger"].close()


def test_a_period_whose_firing_met_an_outage_runs_once_the_database_is_back(
        private_cluster, tmp_path):
    """The scheduler fires while PostgreSQL is down: it retries the claim within the
    period, and the job runs once, for the period it fired in, when the server is back."""
    env = ledger_env(private_cluster.url("ledger"), tmp_path)
    migrate(env)
    fired_at = period_start(datetime.now(UTC), 3600) + timedelta(seconds=5)
    app = create_app(env, clock=FixedClock(fired_at))
    svc = app.extensions["ledger"]
    ran: list[datetime] = []
    job = ScheduledJob(name="outage-probe", period_seconds=3600,
                       func=lambda _engine, _settings, clock: ran.append(clock.now()) or 1)
    outcome: list[runs.RunOutcome | None] = []
    try:
        private_cluster.stop()
        firing = threading.Thread(target=lambda: outcome.append(run_once(
            svc.engine, svc.settings, svc.clock, job, instance="outage")), daemon=True)
        firing.start()
        time.sleep(3)  # the firing met the outage and is retrying its claim
        assert firing.is_alive() and not ran
        private_cluster.start()
        firing.join(WAIT)
        assert not firing.is_alive()
        assert outcome == [runs.RunOutcome.OK]
        assert len(ran) == 1
        with svc.engine.connect() as conn:
            row = conn.execute(select(scheduler_runs.c.period_start, scheduler_runs.c.outcome)
                               .where(scheduler_runs.c.job == "outage-probe")).one()
        assert row.period_start == period_start(fired_at, 3600)
    finally:
        svc.close()


def test_a_stopping_scheduler_ends_a_claim_retry_at_once(private_cluster, tmp_path):
    """A firing retrying its claim through an outage does not hold up a scheduler's stop."""
    env = ledger_env(private_cluster.url("ledger"), tmp_path)
    migrate(env)
    app = create_app(env)
    svc = app.extensions["ledger"]
    job = ScheduledJob(name="outage-stop", period_seconds=3600, func=lambda *_: 1)
    stopping = threading.Event()
    outcome: list[runs.RunOutcome | None] = []
    try:
        private_cluster.stop()
        firing = threading.Thread(target=lambda: outcome.append(run_once(
            svc.engine, svc.settings, svc.clock, job, instance="outage", stopping=stopping)),
            daemon=True)
        firing.start()
        time.sleep(2)
        assert firing.is_alive()
        stopping.set()
        firing.join(BOUNDED)
        assert not firing.is_alive()
        assert outcome == [None]
    finally:
        private_cluster.start()
        svc.close()


def test_a_stall_before_the_body_is_read_is_not_blamed_on_the_sender(pg_url, tmp_path):
    """The integration's look-up waits 1.5 s on a table lock while the sender's whole body
    is already there: the 0.5 s body deadline starts at the first read, so the delivery is
    accepted (a deadline counted from the request's arrival answered 408)."""
    env = ledger_env(pg_url, tmp_path, LEDGER_BODY_READ_TIMEOUT_SECONDS="0.5")
    app = create_app(env)
    locker = create_engine(pg_url)
    try:
        sender = make_sender(app, name="locked")  # never looked up yet: not in the view
        with thread_server(app) as base_url, requests.Session() as session, \
                locker.connect() as conn:
            conn.execute(text("LOCK TABLE integrations IN ACCESS EXCLUSIVE MODE"))
            answers: list[object] = []
            sending = threading.Thread(target=lambda: answers.append(
                post_delivery(session, base_url, sender, "evt_stalled")), daemon=True)
            sending.start()
            time.sleep(1.5)
            conn.rollback()  # the lock goes: the look-up proceeds
            sending.join(WAIT)
        assert len(answers) == 1
        answer = answers[0]
        assert getattr(answer, "status", None) == 202, answer
    finally:
        locker.dispose()
        app.extensions["ledger"].close()
