"""Surviving database faults with real processes on PostgreSQL (bounded, loopback only).

- the database stops mid-load (a private throwaway cluster; never the shared server);
- the pool runs dry under concurrency while the database is slowed by a held lock;
- a connection is killed (pg_terminate_backend) inside an intake and a worker transaction;
- a gunicorn worker is killed with SIGKILL under load.
In every case no acknowledged event is lost and redelivery converges on one receipt each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, select, text

from app import create_app
from ledger.schema import receipts
from tests.conftest import TEST_MASTER_KEY
from tests.helpers import make_sender
from tests.integration.load import (
    REQUEST_TIMEOUT,
    Answer,
    LoadGenerator,
    redeliver_until_acknowledged,
)
from tests.integration.pg_cluster import PrivateCluster
from tests.servers import gunicorn_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
WAIT = 30  # seconds: the bound of every wait in this module
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


def _env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for ledger processes on `url`."""
    return {"DATABASE_URL": url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "fault-tests",
            "LEDGER_DEMO_HANDLERS": "1", "LEDGER_LOG_LEVEL": "WARNING", **extra}


def _sender(env: dict[str, str]):  # type: ignore[no-untyped-def]
    """Create an integration through a short-lived app."""
    setup = create_app(env)
    try:
        return make_sender(setup)
    finally:
        setup.extensions["ledger"].close()


@pytest.fixture
def private_pg(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A migrated database on a throwaway cluster that this test may stop and start."""
    cluster = PrivateCluster(tmp_path)
    try:
        cluster.create()
        cluster.start()
        admin = create_engine(cluster.admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE ledger"))
        admin.dispose()
        env = _env(cluster.url("ledger"), tmp_path)
        done = subprocess.run([str(BIN / "ledger"), "db", "upgrade"], cwd=str(ROOT),
                              env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=WAIT, check=False)
        assert done.returncode == 0, done.stderr
        yield cluster, env
    finally:
        cluster.drop()


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
    with gunicorn_server({**os.environ, **env}, workers=2) as (base_url, _process):
        load = LoadGenerator(base_url, sender, prefix="down").start()
        try:
            load.wait_for(lambda a: sum(x.status == 202 for x in a) >= 20, WAIT, "first acks")
            cluster.stop()
            load.wait_for(lambda a: any(x.status == 503 for x in a), WAIT, "a 503")
            assert _readyz(base_url) == 503
            time.sleep(2)
            cluster.start()
            restarted = len(load.answers)
            load.wait_for(lambda a: sum(x.status == 202 for x in a[restarted:]) >= 20, WAIT,
                          "recovery without a restart of the web processes")
            assert _readyz(base_url) == 200
        finally:
            answers = load.stop()
        failed = sorted({a.event_id for a in answers if a.status != 202})
        redelivered = redeliver_until_acknowledged(base_url, sender, failed)
    hung = [a for a in answers if a.status is None]
    assert not hung, f"requests that never got an answer: {hung[:3]}"
    assert {a.status for a in answers} == {202, 503}
    refusals = [a for a in answers if a.status == 503]
    assert all(a.body == UNAVAILABLE and a.retry_after for a in refusals)
    assert max(a.seconds for a in answers) < REQUEST_TIMEOUT
    assert_converged(env["DATABASE_URL"], answers, redelivered)
