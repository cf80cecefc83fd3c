"""EXPLAIN on PostgreSQL: a rollups run reads the unfinished and the failed receipts from
ix_receipts_open alone (an index-only scan, migration 0016), never the receipts' rows, and
the stored failed cells from ix_hourly_series_failed alone (0017).

Every scheduled run counts them (scope_counts: unfinished per scope and state; hourly_series:
failed per scope and hour, compared with the stored failed cells); fetching each row for its
scope and time cost 0.56-0.67 s a run at 10M receipts, and each stored cell ~0.1 s more. The
statements are the ones the run sends, captured as it runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, event, text

from jobs import rollups
from tests.integration.pg_filled import filled_pg_ledger, insert_integrations

pytestmark = pytest.mark.postgres_only

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RECEIPTS = 60_000
SCOPES = 50


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Engine:
    """A day of receipts: 3 % pending, 1 % failed, the rest complete; vacuumed."""
    for engine in filled_pg_ledger(request, tmp_path_factory.mktemp("open"), _fill):
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM receipts"))
        yield engine


def _fill(conn: Connection) -> None:
    insert_integrations(conn, SCOPES, NOW)
    conn.execute(text(
        "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, "
        "event_id, event_type, body_sha256, result_ref) "
        "SELECT :start + make_interval(secs => g), "
        " CASE WHEN g % 100 < 3 THEN NULL ELSE :start + make_interval(secs => g + 1) END,"
        " 1 + g % :scopes, CASE WHEN g % 100 < 3 THEN 0 WHEN g % 100 = 3 THEN 2 ELSE 1 END,"
        " 1, 'evt_' || md5(g::text), 'demo.credit', decode(md5(g::text), 'hex'), NULL"
        " FROM generate_series(1, :n) g"),
        {"start": NOW - timedelta(days=1), "scopes": SCOPES, "n": RECEIPTS})


def _reads_of_open_receipts(engine: Engine, marker: str = "receipts.state"
                            ) -> list[tuple[str, object]]:
    """Run the rollups once; return the statements that read receipts by state (or that
    hold `marker`)."""
    sent: list[tuple[str, object]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many):  # type: ignore[no-untyped-def]
        if "FROM receipts" in statement and marker in statement:
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        with engine.begin() as conn:
            rollups.refresh_scope_counts(conn, NOW, full=True)
            rollups.refresh_hourly_series(conn, NOW, full=True)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    return sent


def test_the_rollups_count_unfinished_and_failed_receipts_from_the_index_alone(
        ledger: Engine) -> None:
    sent = _reads_of_open_receipts(ledger)
    assert len(sent) == 2, [s for s, _ in sent]  # unfinished per scope; failed per hour
    for plan in _plans(ledger, sent):
        assert "Index Only Scan using ix_receipts_open on receipts" in plan, plan


def test_the_failed_cells_are_compared_from_the_index_alone(ledger: Engine) -> None:
    _reads_of_open_receipts(ledger)  # the series holds this day's failed cells now
    with ledger.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE hourly_series"))
    sent = _reads_of_open_receipts(ledger, marker="stored_failed")
    assert len(sent) == 1, [s for s, _ in sent]
    (plan,) = _plans(ledger, sent)
    assert "Index Only Scan using ix_hourly_series_failed on hourly_series" in plan, plan
    assert "Index Only Scan using ix_receipts_open on receipts" in plan, plan


def _plans(engine: Engine, sent: list[tuple[str, object]]) -> list[str]:
    """Return the plan of each captured statement."""
    plans = []
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        for statement, parameters in sent:
            with raw.cursor() as cursor:
                cursor.execute("EXPLAIN " + statement, parameters)
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return plans
