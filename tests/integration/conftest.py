"""Fixtures shared by integration modules: an app on a clock the test moves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ledger.clock import FixedClock
from tests.integration.pg_cluster import PrivateCluster
from tests.servers import thread_server


@pytest.fixture
def clock() -> FixedClock:
    """A clock that only moves when the test says so (modules may pin its start)."""
    return FixedClock(datetime.now(UTC))


@pytest.fixture
def clocked_env(test_env: dict[str, str]) -> dict[str, str]:
    """Settings of `clocked_app` (modules override this to change a few)."""
    return test_env


@pytest.fixture
def clocked_app(clocked_env, clock):  # type: ignore[no-untyped-def]
    """The app on the test database, reading time from `clock`."""
    from app import create_app

    application = create_app(clocked_env, clock=clock)
    yield application
    application.extensions["ledger"].close()


@pytest.fixture
def live(app):  # type: ignore[no-untyped-def]
    """The app served on a loopback port (a werkzeug thread)."""
    with thread_server(app) as base_url:
        yield base_url


@pytest.fixture
def private_cluster(tmp_path):  # type: ignore[no-untyped-def]
    """A started private PostgreSQL cluster with an empty `ledger` database; dropped after."""
    from sqlalchemy import create_engine, text

    cluster = PrivateCluster(tmp_path)
    try:
        cluster.create()
        cluster.start()
        admin = create_engine(cluster.admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE ledger"))
        admin.dispose()
        yield cluster
    finally:
        cluster.drop()
