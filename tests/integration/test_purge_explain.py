"""EXPLAIN on PostgreSQL: the retention purge's attempts pass stays linear however many
receipts are unfinished.

The pass keeps the attempts of unfinished receipts (those with a job). Written as
`(scope_id, event_id) NOT IN (pending receipts)`, PostgreSQL hashes that set only while it
fits in work_mem; past it, the plan rescans the whole materialised set for every attempt
(the 10M scale bench: 37 s per window). Here work_mem is made small so that 20,000 pending
receipts pass it, as ~196,000 passed the default 4 MB at 10M. Past work_mem each attempt
probes the jobs' primary key, which holds only unfinished work (the receipts' key, probed
before, is the size of the ledger)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, text

from jobs.retention_receipts import _PG_ATTEMPTS_WINDOW, CLOCK_SKEW
from tests.integration.pg_filled import filled_pg_ledger, insert_integrations

pytestmark = pytest.mark.postgres_only

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CUTOFF = NOW - timedelta(days=1)
PENDING = 20_000
COMPLETE = 20_000
SCOPES = 20


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Engine:
    """Old receipts, half complete and half still pending (a long worker outage) with
    their jobs, one attempt each; 'retry' on the pending ones."""
    yield from filled_pg_ledger(request, tmp_path_factory.mktemp("backlog"), _fill)


def _fill(conn: Connection) -> None:
    insert_integrations(conn, SCOPES, NOW)
    start = CUTOFF - timedelta(days=2)
    conn.execute(text(
        "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, "
        "event_id, event_type, body_sha256, result_ref) "
        "SELECT :start + make_interval(secs => g), "
        " CASE WHEN g <= :pending THEN NULL ELSE :start + make_interval(secs => g) END,"
        " 1 + g % :scopes, CASE WHEN g <= :pending THEN 0 ELSE 1 END, 1, 'evt_' || md5(g::text),"
        " 'demo.credit', decode(md5(g::text), 'hex'), NULL FROM generate_series(1, :n) g"),
        {"start": start, "pending": PENDING, "scopes": SCOPES, "n": PENDING + COMPLETE})
    conn.execute(text(
        "INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token, started_at,"
        " finished_at, outcome) SELECT scope_id, event_id, 1, 'w', 1, accepted_at,"
        " accepted_at, CASE WHEN state = 0 THEN 'retry' ELSE 'complete' END FROM receipts"))
    conn.execute(text(
        "INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status,"
        " attempts, lease_token, payload) SELECT scope_id, event_id, event_type, accepted_at,"
        " accepted_at, 0, 1, 1, '{}' FROM receipts WHERE state = 0"))


def _params() -> dict[str, object]:
    """One window over the whole table."""
    return {"lo": "(0,0)", "hi": "(1000000,0)", "before": CUTOFF - CLOCK_SKEW}


def test_the_attempts_pass_probes_each_job_instead_of_rescanning_the_unfinished_set(
        backlog: Engine) -> None:
    with backlog.connect() as conn:
        conn.execute(text("SET LOCAL work_mem = '64kB'"))
        plan = "\n".join(row[0] for row in conn.execute(
            text("EXPLAIN " + str(_PG_ATTEMPTS_WINDOW)), _params()))
        assert "Materialize" not in plan, plan  # no per-row rescan of the unfinished set
        assert "using pk_jobs on jobs" in plan, plan
        assert "receipts" not in plan, plan  # the receipts' key is the ledger's size


def test_the_attempts_pass_deletes_only_what_no_unfinished_receipt_needs(backlog: Engine) -> None:
    with backlog.connect() as conn:  # rolled back at the end: the other test's data stays
        conn.execute(text("SET LOCAL work_mem = '64kB'"))
        deleted = conn.execute(_PG_ATTEMPTS_WINDOW, _params()).rowcount
        left = conn.execute(text(
            "SELECT count(*) FILTER (WHERE outcome = 'retry'),"
            " count(*) FILTER (WHERE outcome = 'complete') FROM attempts")).one()
        conn.rollback()
    assert deleted == COMPLETE
    assert tuple(left) == (PENDING, 0)
