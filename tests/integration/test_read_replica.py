"""A read replica (LEDGER_READ_DATABASE_URL) on a real streaming standby.

A private primary and a standby made by `pg_basebackup -R` (tests/integration/pg_cluster.py,
loopback ports, temp dirs, never the shared server). Routing is proven by pausing the
standby's replay: what the primary wrote since is not on the pages until replay resumes.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from app import create_app
from ledger.db.engine import upgrade
from tests.conftest import IN_CI, TEST_AUDIT_KEY, TEST_MASTER_KEY
from tests.dashboard_helpers import fast_hashes, logged_in, make_operator, make_token, post
from tests.helpers import WAIT, deliver, event_body, make_sender
from tests.integration.pg_cluster import PrivateCluster

__all__ = ["fast_hashes"]  # the autouse fixture: cheap password hashes here too

SOURCE, LAG = "X-Ledger-Read-Source", "X-Ledger-Replica-Lag-Seconds"


class Pair:
    """A running primary and its streaming standby, each with the migrated `ledger` database."""

    def __init__(self, tmp: Path) -> None:
        self.primary = PrivateCluster(tmp / "primary")
        self.standby = PrivateCluster(tmp / "standby")
        self.tmp = tmp

    def start(self) -> None:
        """Create the primary, migrate its database, then clone and start the standby."""
        self.primary.create()
        self.primary.start()
        _autocommit(self.primary.admin_url, "CREATE DATABASE ledger")
        engine = create_engine(self.primary.url("ledger"))
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        self.standby.create_standby(self.primary)
        self.standby.start()

    def env(self, **extra: str) -> dict[str, str]:
        """Return the app's settings: primary and read replica."""
        return {"DATABASE_URL": self.primary.url("ledger"),
                "LEDGER_READ_DATABASE_URL": self.standby.url("ledger"),
                "LEDGER_MASTER_KEY": TEST_MASTER_KEY, "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY,
                "LEDGER_VAR_DIR": str(self.tmp), "LEDGER_SECRET_KEY": "replica-tests", **extra}

    def on_standby(self, sql: str) -> Any:
        """Run one statement on the standby's ledger database; return its first value."""
        return _autocommit(self.standby.url("ledger"), sql)

    def wait_replayed(self) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        lsn = _autocommit(self.primary.url("ledger"), "SELECT pg_current_wal_lsn()::text")
        _wait(lambda: self.on_standby(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'"),
              "the standby to replay the primary's writes")

    def wait_received(self) -> None:
        """Wait until the standby has received (not necessarily replayed) the primary's WAL."""
        lsn = _autocommit(self.primary.url("ledger"), "SELECT pg_current_wal_lsn()::text")
        _wait(lambda: self.on_standby(f"SELECT pg_last_wal_receive_lsn() >= '{lsn}'"),
              "the standby to receive the primary's writes")

    def pause(self) -> None:
        """Pause replay on the standby (WAL still arrives) and wait until it is paused."""
        self.on_standby("SELECT pg_wal_replay_pause()")
        _wait(lambda: self.on_standby("SELECT pg_get_wal_replay_pause_state()") == "paused",
              "replay to pause")

    def resume(self) -> None:
        """Resume replay and wait until the standby has caught up."""
        self.on_standby("SELECT pg_wal_replay_resume()")
        self.wait_replayed()

    def drop(self) -> None:
        """Stop and remove both clusters."""
        self.standby.drop()
        self.primary.drop()


def _autocommit(url: str, sql: str) -> Any:
    """Run one statement in autocommit; return the first value of its first row, if any."""
    engine: Engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.execute(text(sql))
            return result.scalar() if result.returns_rows else None
    finally:
        engine.dispose()


def _wait(predicate: Any, what: str) -> None:
    """Poll until `predicate()` holds, at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """A primary and a streaming standby for this module; fails (never skips) in CI."""
    made = Pair(tmp_path_factory.mktemp("replica"))
    try:
        made.start()
    except Exception as error:
        made.drop()
        if IN_CI:
            pytest.fail(f"CI=true and the primary + streaming standby could not start: {error}",
                        pytrace=False)
        pytest.skip(f"no private primary + standby on this machine (never skipped in CI): "
                    f"{error}")
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture
def replica_app(pair: Pair) -> Iterator[Any]:
    """The web app on the primary with the standby as its read replica."""
    application = create_app(pair.env())
    yield application
    application.extensions["ledger"].close()


def _text(response: Any) -> str:
    """Return a response body as text."""
    return str(response.get_data(as_text=True))


def _line(page: str) -> str:
    """Return the page's read-source line, whitespace collapsed."""
    found = re.search(r'<p id="read-source"[^>]*>(.*?)</p>', page, re.S)
    assert found, "the page has no read-source line"
    return " ".join(html.unescape(found.group(1)).split())


@pytest.mark.slow
@pytest.mark.postgres_only
def test_pages_and_api_read_the_replica_and_show_its_lag(pair: Pair, replica_app: Any) -> None:
    sender = make_sender(replica_app, name="routing")
    client = logged_in(replica_app, "oncall", "olga")
    assert deliver(client, sender, "evt_seen").status_code == 202
    pair.wait_replayed()
    caught_up = client.get(f"/receipts?scope={sender.scope}")
    assert caught_up.status_code == 200 and "evt_seen" in _text(caught_up)
    assert caught_up.headers[SOURCE] == "replica"
    # Caught up: lag 0 (polled: a heartbeat the app writes may be in flight for a moment).
    _wait(lambda: _line(_text(client.get("/stuck"))).startswith(
        "Read from the replica: lag 0 s (it has replayed everything it received)"),
        "a caught-up replica to show lag 0")

    pair.pause()
    try:
        assert deliver(client, sender, "evt_not_yet").status_code == 202  # on the primary
        pair.wait_received()  # the WAL is on the standby, not replayed
        time.sleep(0.3)
        page = client.get(f"/receipts?scope={sender.scope}")
        assert page.status_code == 200 and page.headers[SOURCE] == "replica"
        assert "evt_seen" in _text(page) and "evt_not_yet" not in _text(page)
        assert float(page.headers[LAG]) > 0.2
        assert re.match(r"Read from the replica: \d+\.\d s behind the primary", _line(_text(page)))
        polled = _text(client.get(f"/receipts?scope={sender.scope}",
                                  headers={"HX-Request": "true"}))
        assert "<html" not in polled and 'hx-swap-oob="true"' in polled  # the line, updated
        assert _line(polled).startswith("Read from the replica:")
        api = client.get(f"/api/v1/receipts?scope={sender.scope}")
        assert api.status_code == 200 and api.headers[SOURCE] == "replica"
        assert set(api.get_json()) == {"items", "next_cursor"}  # the contract's keys only
        assert [i["event_id"] for i in api.get_json()["items"]] == ["evt_seen"]
        assert float(api.headers[LAG]) > 0.2
        assert client.get("/api/v1/receipts/"
                          f"{sender.public_id}/evt_not_yet").status_code == 404
        metrics = _text(client.get("/metrics"))
        assert "ledger_replica_up 1.0" in metrics
        lag = re.search(r"^ledger_replica_lag_seconds (\S+)$", metrics, re.M)
        assert lag and float(lag.group(1)) > 0.2

        # An action writes on the primary while the replica lags; the page shown next
        # to this session reads the primary (its own change is not on the replica yet).
        other = event_body(sender, "evt_seen", data={"amount": 2})
        assert deliver(client, sender, "evt_seen", body=other).status_code == 409
        conflict_id = _autocommit(pair.primary.url("ledger"), "SELECT max(id) FROM conflicts")
        acked = post(client, f"/conflicts/{conflict_id}/ack", {"note": "seen on the primary"})
        assert acked.status_code == 200 and "acknowledged" in _text(acked)
        assert _autocommit(pair.primary.url("ledger"),
                           f"SELECT acknowledged_by FROM conflicts WHERE id = {conflict_id}"
                           ) == "olga"
        after = client.get("/conflicts")
        assert after.headers[SOURCE] == "primary"
        assert "your last change has not reached the replica yet" in _line(_text(after))
        receipts_now = client.get(f"/receipts?scope={sender.scope}")
        assert "evt_not_yet" in _text(receipts_now)  # still this session's primary reads
    finally:
        pair.resume()
    resumed = client.get(f"/receipts?scope={sender.scope}")
    assert resumed.headers[SOURCE] == "replica" and "evt_not_yet" in _text(resumed)
    assert _line(_text(resumed)).startswith("Read from the replica")


@pytest.mark.slow
@pytest.mark.postgres_only
def test_a_replica_over_the_lag_bound_is_not_read(pair: Pair) -> None:
    application = create_app(pair.env(LEDGER_READ_MAX_LAG_SECONDS="0.5"))
    try:
        sender = make_sender(application, name="bound")
        client = logged_in(application, "viewer", "vera")
        pair.wait_replayed()
        _wait(lambda: client.get("/stuck").headers[SOURCE] == "replica",
              "the replica to serve while under the bound")
        pair.pause()
        try:
            assert deliver(client, sender, "evt_bound").status_code == 202
            pair.wait_received()
            time.sleep(0.8)  # the last replayed commit is now older than the bound
            page = client.get(f"/receipts?scope={sender.scope}")
            assert page.status_code == 200 and page.headers[SOURCE] == "primary"
            assert "evt_bound" in _text(page)
            assert re.fullmatch(r"Read from the primary: the replica is more than "
                                r"LEDGER_READ_MAX_LAG_SECONDS \(0\.5 s\) behind \(replica "
                                r"lag \d+\.\d s\)\.", _line(_text(page)))
            api = client.get("/api/v1/overview")
            assert api.status_code == 200 and api.headers[SOURCE] == "primary"
            assert float(api.headers[LAG]) > 0.5
        finally:
            pair.resume()
    finally:
        application.extensions["ledger"].close()


@pytest.mark.slow
@pytest.mark.postgres_only
def test_a_stopped_replica_falls_back_to_the_primary(pair: Pair, replica_app: Any) -> None:
    sender = make_sender(replica_app, name="fallback")
    client = logged_in(replica_app, "viewer", "vic")
    pair.standby.stop()
    try:
        assert deliver(client, sender, "evt_while_down").status_code == 202
        started = time.monotonic()
        first = client.get("/stuck")
        assert first.status_code == 200 and first.headers[SOURCE] == "primary"
        assert _line(_text(first)) == "Read from the primary: the replica is unreachable."
        notes = []
        for path in ("/", f"/receipts?scope={sender.scope}", "/stuck", "/failures/groups",
                     "/deliveries", "/audit", "/capacity",
                     f"/receipts/{sender.public_id}/evt_while_down"):
            page = client.get(path)
            assert page.status_code == 200, path
            assert page.headers[SOURCE] == "primary", path
            notes.append(_line(_text(page)))
        # Right after the failure the replica is not even tried (no connect timeout per page).
        assert notes[0] == "Read from the primary: the replica failed less than 5 s ago."
        assert set(notes) <= {notes[0], "Read from the primary: the replica is unreachable."}
        assert "evt_while_down" in _text(client.get(f"/receipts?scope={sender.scope}"))
        api = client.get(f"/api/v1/receipts?scope={sender.scope}")
        assert api.status_code == 200 and api.headers[SOURCE] == "primary"
        assert [i["event_id"] for i in api.get_json()["items"]] == ["evt_while_down"]
        assert time.monotonic() - started < 10  # no page waited out a connect timeout
        assert "ledger_replica_up 0.0" in _text(client.get("/metrics"))
    finally:
        pair.standby.start()
    pair.wait_replayed()


@pytest.mark.slow
@pytest.mark.postgres_only
def test_an_api_token_reads_its_own_write_while_the_replica_lags(pair: Pair,
                                                                 replica_app: Any) -> None:
    sender = make_sender(replica_app, name="tokens")
    make_operator(replica_app, "tess", "oncall")
    writer = {"Authorization": f"Bearer {make_token(replica_app, 'tess', write=True)}"}
    reader = {"Authorization": f"Bearer {make_token(replica_app, 'tess')}"}
    client = replica_app.test_client()
    conflicts = f"/api/v1/conflicts?scope={sender.scope}"
    assert deliver(client, sender, "evt_tok").status_code == 202
    other = event_body(sender, "evt_tok", data={"amount": 9})
    assert deliver(client, sender, "evt_tok", body=other).status_code == 409
    pair.wait_replayed()
    conflict_id = _autocommit(pair.primary.url("ledger"), "SELECT max(id) FROM conflicts")
    assert client.get(conflicts, headers=writer).headers[SOURCE] == "replica"

    pair.pause()
    try:
        acked = client.post(f"/conflicts/{conflict_id}/ack", headers=writer,
                            data={"note": "acknowledged by a script"})
        assert acked.status_code == 200
        pair.wait_received()
        # The writing token reads the primary and sees its acknowledgement ...
        mine = client.get(conflicts, headers=writer)
        assert mine.status_code == 200 and mine.headers[SOURCE] == "primary"
        assert [c["acknowledged_by"] for c in mine.get_json()["items"]] == ["tess"]
        # ... another token, which wrote nothing, is still served by the lagging replica.
        theirs = client.get(conflicts, headers=reader)
        assert theirs.status_code == 200 and theirs.headers[SOURCE] == "replica"
        assert [c["acknowledged_by"] for c in theirs.get_json()["items"]] == [None]
        # A refused write (a read-only token) records no write position.
        refused = client.post(f"/conflicts/{conflict_id}/ack", headers=reader,
                              data={"note": "not allowed"})
        assert refused.status_code == 403
        assert client.get(conflicts, headers=reader).headers[SOURCE] == "replica"
    finally:
        pair.resume()
    pair.wait_replayed()
    caught_up = client.get(conflicts, headers=writer)
    assert caught_up.headers[SOURCE] == "replica"
    assert [c["acknowledged_by"] for c in caught_up.get_json()["items"]] == ["tess"]


def test_without_a_replica_nothing_changes(app: Any) -> None:  # both databases
    sender = make_sender(app)
    client = logged_in(app, "viewer")
    assert deliver(client, sender, "evt_plain").status_code == 202
    page = client.get(f"/receipts?scope={sender.scope}")
    api = client.get(f"/api/v1/receipts?scope={sender.scope}")
    assert page.status_code == 200 and "evt_plain" in _text(page)
    assert 'id="read-source"' not in _text(page)
    assert SOURCE not in page.headers and SOURCE not in api.headers and LAG not in api.headers
    assert "ledger_replica" not in _text(client.get("/metrics"))
