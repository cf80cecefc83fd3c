"""How ledger.db.replica reads the lag it reports, and when it reads the primary instead.

The real standby is in tests/integration/test_read_replica.py; here the lag row and the
failures are made up so each branch is seen on its own.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy import exc as sa_exc

from ledger.db import replica
from ledger.db.replica import ReplicaReads, measure_lag


class LagRow:
    """A connection whose lag query answers one made-up row."""

    def __init__(self, **row: Any) -> None:
        self.row = SimpleNamespace(**row)

    def execute(self, _sql: Any) -> Any:
        return SimpleNamespace(one=lambda: self.row)


def lag_of(**row: Any) -> tuple[float | None, str | None]:
    """Return measure_lag's answer for one row."""
    fake: Any = LagRow(**row)
    return measure_lag(fake)


def test_a_streaming_replica_that_replayed_all_it_received_has_no_lag() -> None:
    # However old its last replayed commit: an idle primary sends nothing new.
    assert lag_of(standby=True, streaming=True, caught_up=True, replay_age=900.0) == (0.0, None)


def test_a_replica_behind_reports_the_age_of_its_last_replayed_change() -> None:
    assert lag_of(standby=True, streaming=True, caught_up=False, replay_age=3.25) == (3.25, None)


def test_a_replica_that_replayed_nothing_yet_has_an_unknown_lag() -> None:
    lag, note = lag_of(standby=True, streaming=False, caught_up=False, replay_age=None)
    assert lag is None and note is not None and "no replay yet" in note


def test_a_replica_cut_off_from_the_primary_says_so() -> None:
    lag, note = lag_of(standby=True, streaming=False, caught_up=True, replay_age=42.0)
    assert lag == 42.0 and note == "the replica is not streaming from the primary"


def test_a_server_not_in_recovery_is_current() -> None:
    assert lag_of(standby=False, streaming=False, caught_up=False, replay_age=None) == (0.0, None)


def _engine(name: str) -> Any:
    """Return a SQLite engine whose one table says which database it is."""
    engine = create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE which (name TEXT)"))
        conn.execute(text("INSERT INTO which VALUES (:n)"), {"n": name})
    return engine


def which(conn: Connection) -> str:
    """The read under test: name the database it ran on."""
    return str(conn.execute(text("SELECT name FROM which")).scalar_one())


@pytest.fixture
def lag(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Make the replica's measured lag whatever the test sets."""
    measured: dict[str, Any] = {"value": (0.0, None)}
    monkeypatch.setattr(replica, "measure_lag", lambda _conn: measured["value"])
    return measured


def test_reads_go_to_the_replica_with_its_lag(lag: dict[str, Any]) -> None:
    lag["value"] = (1.5, None)
    result, source = ReplicaReads(_engine("primary"), _engine("replica")).run(which)
    assert result == "replica" and source.replica and source.lag_seconds == 1.5


def test_a_replica_failing_during_the_read_is_read_again_on_the_primary_then_skipped(
        lag: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    reads = ReplicaReads(_engine("primary"), _engine("replica"))

    def broken(conn: Connection) -> str:
        if which(conn) == "replica":
            raise sa_exc.OperationalError("SELECT", {}, Exception("server closed the connection"))
        return which(conn)

    result, source = reads.run(broken)
    assert result == "primary" and not source.replica
    assert source.note == "the replica is unreachable"
    result, source = reads.run(which)  # skipped for RETRY_SECONDS
    assert result == "primary" and source.note == "the replica failed less than 5 s ago"
    now = replica.time.monotonic()
    monkeypatch.setattr(replica.time, "monotonic", lambda: now + replica.RETRY_SECONDS + 0.1)
    assert reads.run(which)[0] == "replica"  # then tried again


def test_over_the_lag_bound_or_unknown_reads_the_primary(lag: dict[str, Any]) -> None:
    reads = ReplicaReads(_engine("primary"), _engine("replica"), max_lag_seconds=2)
    lag["value"] = (2.0, None)
    assert reads.run(which)[0] == "replica"  # at the bound: still served
    lag["value"] = (2.5, None)
    result, source = reads.run(which)
    assert result == "primary" and source.lag_seconds == 2.5
    assert source.note == "the replica is more than LEDGER_READ_MAX_LAG_SECONDS (2 s) behind"
    lag["value"] = (None, "no replay yet")
    assert reads.run(which)[1].note == ("the replica's lag is unknown and "
                                        "LEDGER_READ_MAX_LAG_SECONDS is 2 s")


def test_without_a_replica_everything_reads_the_primary() -> None:
    result, source = ReplicaReads(_engine("primary"), None).run(which)
    assert result == "primary" and not source.replica and source.note is None
