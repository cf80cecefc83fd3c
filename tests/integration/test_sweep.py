"""Stuck-work and integrity sweep (jobs/sweep.py), both databases."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from jobs.sweep import sweep
from ledger.clock import FixedClock
from ledger.db.schema import findings, jobs, receipts, scheduler_runs
from ledger.domain import JobStatus, ReceiptState
from ledger.metrics.export import render_metrics
from ledger.scheduling import runs
from tests.helpers import make_sender
from tests.integration.ledger_rows import add_receipt

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _stuck_ledger(app):
    """Write healthy work plus one case of every finding kind."""
    svc = app.extensions["ledger"]
    s = make_sender(app).scope_id
    ago = lambda seconds: NOW - timedelta(seconds=seconds)  # noqa: E731
    with svc.engine.begin() as conn:
        # healthy: due a moment ago, leased and still inside its lease, finished
        add_receipt(conn, s, "fresh", state=ReceiptState.PENDING, accepted_at=ago(5),
                    job=JobStatus.QUEUED)
        add_receipt(conn, s, "leased", state=ReceiptState.PENDING, accepted_at=ago(30),
                    job=JobStatus.QUEUED, run_at=ago(-30), leased_until=ago(-30))
        add_receipt(conn, s, "done", state=ReceiptState.COMPLETE, accepted_at=ago(3600))
        add_receipt(conn, s, "dead-letter", state=ReceiptState.FAILED, accepted_at=ago(9000),
                    job=JobStatus.FAILED)
        # stuck and inconsistent
        add_receipt(conn, s, "lost-lease", state=ReceiptState.PENDING, accepted_at=ago(600),
                    job=JobStatus.QUEUED, run_at=ago(400), leased_until=ago(400))
        add_receipt(conn, s, "overdue", state=ReceiptState.PENDING, accepted_at=ago(2000),
                    job=JobStatus.QUEUED, run_at=ago(1000))
        add_receipt(conn, s, "no-job", state=ReceiptState.PENDING, accepted_at=ago(100))
        add_receipt(conn, s, "orphan", state=ReceiptState.PENDING, accepted_at=ago(100),
                    job=JobStatus.QUEUED)
        conn.execute(receipts.delete().where(receipts.c.event_id == "orphan"))
        add_receipt(conn, s, "twice", state=ReceiptState.COMPLETE, accepted_at=ago(100),
                    job=JobStatus.QUEUED)
    return svc


def _open(svc) -> dict[str, str]:
    with svc.engine.connect() as conn:
        rows = conn.execute(select(findings.c.subject, findings.c.kind)
                            .where(findings.c.resolved_at.is_(None))).all()
    return {subject.split(":", 1)[1]: kind for subject, kind in rows}


def test_sweep_records_one_finding_per_stuck_or_inconsistent_item(app):
    svc = _stuck_ledger(app)
    sweep(svc.engine, svc.settings, FixedClock(NOW))
    assert _open(svc) == {
        "lost-lease": "lease_expired", "overdue": "overdue", "no-job": "pending_without_job",
        "orphan": "job_without_receipt", "twice": "job_of_complete_receipt",
    }
    with svc.engine.connect() as conn:
        row = conn.execute(select(findings).where(findings.c.kind == "lease_expired")).one()
    assert row.subject == "acme/stripe-prod:lost-lease"
    assert json.loads(row.detail)["leased_by"] == "w1"
    exposition = render_metrics(svc.engine, FixedClock(NOW), revocation_bound_seconds=30)[0]
    assert 'ledger_findings_open{kind="overdue"} 1.0' in exposition.decode().splitlines()


def test_findings_resolve_when_fixed_and_reopen_when_back(app):
    svc = _stuck_ledger(app)
    clock = FixedClock(NOW)
    sweep(svc.engine, svc.settings, clock)
    with svc.engine.begin() as conn:  # a worker picks up the overdue job
        conn.execute(update(jobs).where(jobs.c.event_id == "overdue")
                     .values(run_at=NOW + timedelta(seconds=60)))
    later = clock.advance(60)
    sweep(svc.engine, svc.settings, clock)
    assert "overdue" not in _open(svc)
    with svc.engine.connect() as conn:
        resolved = conn.execute(select(findings).where(findings.c.kind == "overdue")).one()
        lasting = conn.execute(select(findings).where(findings.c.kind == "lease_expired")).one()
    assert resolved.resolved_at == later
    assert (lasting.first_seen, lasting.last_seen) == (NOW, later)

    with svc.engine.begin() as conn:  # stuck again an hour later
        conn.execute(update(jobs).where(jobs.c.event_id == "overdue").values(run_at=NOW))
    again = clock.advance(3600)
    sweep(svc.engine, svc.settings, clock)
    with svc.engine.connect() as conn:
        back = conn.execute(select(findings).where(
            findings.c.subject == "acme/stripe-prod:overdue")).one()
    assert back.resolved_at is None and back.first_seen == again


def test_sweep_marks_runs_of_a_dead_scheduler_abandoned(app):
    """A run whose holder stopped renewing is abandoned as soon as its lease runs out."""
    svc = app.extensions["ledger"]
    ago = lambda seconds: NOW - timedelta(seconds=seconds)  # noqa: E731
    with svc.engine.begin() as conn:
        dead = runs.claim_run(conn, job="retention", period_start=ago(3600),
                              instance="host:1:dead", now=ago(70), lease_seconds=60)
        live = runs.claim_run(conn, job="rollups", period_start=ago(3600),
                              instance="host:2:live", now=ago(3600), lease_seconds=60)
        assert runs.renew_lease(conn, live, now=ago(20), lease_seconds=60)  # alive
        done = runs.claim_run(conn, job="sweep", period_start=ago(60),
                              instance="host:2:live", now=ago(60), lease_seconds=60)
        runs.finish_run(conn, done, outcome=runs.RunOutcome.OK, now=ago(59), rows_affected=3)
    sweep(svc.engine, svc.settings, FixedClock(ago(11)))  # the dead run's lease runs 1 s more
    assert _outcomes(svc) == {dead: "running", live: "running", done: "ok"}
    sweep(svc.engine, svc.settings, FixedClock(ago(9)))  # no other run of its job needed
    assert _outcomes(svc) == {dead: "abandoned", live: "running", done: "ok"}


def test_runs_from_before_leases_are_abandoned_once_a_later_run_finished(app):
    svc = app.extensions["ledger"]
    hour = timedelta(hours=1)
    with svc.engine.begin() as conn:
        dead = runs.claim_run(conn, job="rollups", period_start=NOW - 3 * hour,
                              instance="host:1:dead", now=NOW - 3 * hour, lease_seconds=60)
        live = runs.claim_run(conn, job="retention", period_start=NOW - hour,
                              instance="host:2:live", now=NOW - hour, lease_seconds=60)
        newer = runs.claim_run(conn, job="rollups", period_start=NOW - 2 * hour,
                               instance="host:2:live", now=NOW - 2 * hour, lease_seconds=60)
        runs.finish_run(conn, newer, outcome=runs.RunOutcome.OK, now=NOW - 2 * hour,
                        rows_affected=3)
        conn.execute(update(scheduler_runs).values(leased_until=None))  # pre-0003 rows
    sweep(svc.engine, svc.settings, FixedClock(NOW))
    # no later finished run of 'retention' exists, so that run may still be working
    assert _outcomes(svc) == {dead: "abandoned", live: "running", newer: "ok"}


def _outcomes(svc) -> dict[int, str]:
    with svc.engine.connect() as conn:
        return dict(conn.execute(select(scheduler_runs.c.id, scheduler_runs.c.outcome)).all())
