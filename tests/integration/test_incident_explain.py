"""EXPLAIN on PostgreSQL: the incident pages' new reads use their indexes, never a sequential
scan of a big table (receipts, jobs, attempts, deliveries, the audit log)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text

from jobs.retention_preview import expired_by_scope_stmt
from ledger.reads.deliveries import DeliveryFilter, deliveries_stmt
from ledger.reads.revocations import uses_after_stmt
from ledger.reads.search import delivery_hits_stmt
from ledger.reads.stuck import running_stmt
from ledger.reads.throughput import newest_attempts_stmt, per_minute_stmt
from ledger.web.dashboard.drill_page import last_start_stmt
from tests.integration.pg_filled import filled_pg_ledger, insert_integrations
from tests.integration.test_dashboard_explain import _plan

pytestmark = pytest.mark.postgres_only

ROWS = 50_000
SCOPES = 50
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
KEY = "key_" + "0" * 21 + "7"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    """Receipts, a queued backlog, attempts, a delivery log and an audit log, analysed."""
    yield from filled_pg_ledger(request, tmp_path_factory.mktemp("incident"), _fill)


def _fill(conn: Connection) -> None:
    insert_integrations(conn, SCOPES, NOW)
    params = {"now": NOW, "n": ROWS, "scopes": SCOPES}
    conn.execute(text(
        "INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, event_id,"
        " event_type, body_sha256, result_ref) SELECT :now - make_interval(mins => :n - g),"
        " :now - make_interval(mins => :n - g), 1 + g % :scopes, 1, 1, 'evt_' || g,"
        " 'demo.credit', decode(md5(g::text), 'hex'), 'ok' FROM generate_series(1, :n) g"),
        params)
    conn.execute(text(  # a backlog: queued jobs due over the last days, a few leased
        "INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status,"
        " attempts, lease_token, leased_by, leased_until, payload)"
        " SELECT 1 + g % :scopes, 'job_' || g, 'demo.credit', :now - make_interval(mins => g),"
        " :now - make_interval(mins => g), 0, 0, 0,"
        " CASE WHEN g % 500 = 0 THEN 'w:1:x' END, CASE WHEN g % 500 = 0 THEN :now END, '{}'"
        " FROM generate_series(1, :n) g"), params)
    conn.execute(text(
        "INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token, started_at,"
        " finished_at, outcome) SELECT 1 + g % :scopes, 'evt_' || g, 1, 'w', 1,"
        " :now - make_interval(secs => :n - g), :now - make_interval(secs => :n - g),"
        " 'complete' FROM generate_series(1, :n) g"), params)
    conn.execute(text(
        "INSERT INTO deliveries (at, integration_id, public_id, outcome, http_status, key_id,"
        " event_id, client, reason, count) SELECT :now - make_interval(secs => :n - g),"
        " 1 + g % :scopes, NULL, 'accepted', 202, 'key_' || lpad((g % 500)::text, 22, '0'),"
        " 'evt_' || g, '10.0.0.1', NULL, 1 FROM generate_series(1, :n) g"), params)
    conn.execute(text(
        "INSERT INTO audit_log (at, actor, role, action, target, prev_hash, row_hash)"
        " SELECT :now - make_interval(secs => :n - g), 'olga', 'oncall',"
        " CASE WHEN g % 1000 = 0 THEN 'drill.start' ELSE 'receipt.requeue' END,"
        " 'drill:' || g, 'x', 'y' FROM generate_series(1, :n) g"), params)


def _no_seq_scan(plan: str, *tables: str) -> None:
    for table in tables:
        assert f"Seq Scan on {table}" not in plan, plan


def test_refusal_finding_reads_use_the_event_index(big: Engine) -> None:
    by_event = _plan(big, deliveries_stmt(DeliveryFilter(event_id="evt_1234"), None, 51))
    assert "ix_deliveries_event" in by_event, by_event
    _no_seq_scan(by_event, "deliveries")
    hits = _plan(big, delivery_hits_stmt("evt_1234", lateral=True))
    assert "ix_deliveries_event" in hits, hits
    _no_seq_scan(hits, "deliveries")
    prefix = _plan(big, deliveries_stmt(DeliveryFilter(integration_ids=(3, 4, 5)), None, 51))
    _no_seq_scan(prefix, "deliveries")


def test_work_in_flight_reads_are_bounded(big: Engine) -> None:
    running = _plan(big, running_stmt(NOW))
    assert "ix_jobs_due" in running, running
    _no_seq_scan(running, "jobs", "attempts")
    newest = _plan(big, newest_attempts_stmt())
    _no_seq_scan(newest, "attempts")
    counted = _plan(big, per_minute_stmt([NOW - timedelta(minutes=m) for m in range(15, -1, -1)]))
    _no_seq_scan(counted, "attempts")


def test_revocation_drill_and_purge_preview_reads_use_indexes(big: Engine) -> None:
    uses = _plan(big, uses_after_stmt(KEY, NOW - timedelta(hours=1)))
    assert "ix_deliveries_key" in uses, uses
    drill = _plan(big, last_start_stmt())
    assert "ix_audit_action" in drill, drill
    _no_seq_scan(drill, "audit_log")
    # A few percent of the receipts are past retention, as in a ledger at its steady state.
    preview = _plan(big, expired_by_scope_stmt(NOW - timedelta(days=33), 100_000))
    _no_seq_scan(preview, "receipts")
