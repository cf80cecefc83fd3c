"""The once-per-period guard and the scheduler's wiring (ledger/scheduler.py), both databases."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from ledger.clock import FixedClock
from ledger.db.schema import scheduler_runs
from ledger.scheduling import runs
from ledger.scheduling.runner import (
    ScheduledJob,
    build_scheduler,
    claim_period,
    run_once,
    run_scheduler,
)

NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


def _rows(svc) -> list:
    with svc.engine.connect() as conn:
        return conn.execute(select(scheduler_runs).order_by(scheduler_runs.c.id)).all()


def test_only_one_instance_runs_a_period_and_the_next_period_runs_again(app):
    svc = app.extensions["ledger"]
    calls: list[str] = []
    job = ScheduledJob(name="tick", period_seconds=60,
                       func=lambda engine, settings, clock: calls.append("x") or 7)
    clock = FixedClock(NOW)
    first = run_once(svc.engine, svc.settings, clock, job, instance="a")
    second = run_once(svc.engine, svc.settings, clock, job, instance="b")
    assert (first, second, len(calls)) == (runs.RunOutcome.OK, None, 1)
    clock.advance(60)
    assert run_once(svc.engine, svc.settings, clock, job, instance="b") is runs.RunOutcome.OK
    rows = _rows(svc)
    assert [(r.instance, r.period_start, r.outcome, r.rows_affected) for r in rows] == [
        ("a", datetime(2026, 6, 1, 12, 0, tzinfo=UTC), "ok", 7),
        ("b", datetime(2026, 6, 1, 12, 1, tzinfo=UTC), "ok", 7)]
    assert rows[0].finished_at == NOW


def test_a_failing_job_records_its_error_class_without_parameters(app):
    svc = app.extensions["ledger"]

    def broken(engine, settings, clock):
        raise sa_exc.IntegrityError("DELETE FROM jobs WHERE payload = %s",
                                    {"payload": "card=4242"}, ValueError("constraint x"))

    job = ScheduledJob(name="broken", period_seconds=60, func=broken)
    assert run_once(svc.engine, svc.settings, FixedClock(NOW), job,
                    instance="a") is runs.RunOutcome.ERROR
    (row,) = _rows(svc)
    assert row.outcome == "error" and row.rows_affected is None
    assert row.error == "ValueError: constraint x"


def test_build_scheduler_registers_every_job_with_overrides_and_scale(app):
    svc = app.extensions["ledger"]
    scheduler = build_scheduler(svc, period_overrides={"sweep": 5, "rollups": 0},
                                period_scale=0.5)
    assert isinstance(scheduler, BlockingScheduler)
    periods = {j.id: j.trigger.interval.total_seconds() for j in scheduler.get_jobs()}
    assert periods == {"retention": 1800, "delivery_log_retention": 300, "sweep": 5,
                       "credential_expiry": 30, "revocation_propagation": 15}
    assert isinstance(build_scheduler(svc, background=True), BackgroundScheduler)


def test_run_scheduler_in_a_thread_runs_the_real_jobs_until_stopped(app):
    svc = app.extensions["ledger"]
    stop = threading.Event()
    thread = threading.Thread(target=run_scheduler, args=(svc, stop), kwargs={
        "period_overrides": {"retention": 1, "sweep": 1, "rollups": 1, "credential_expiry": 0,
                             "revocation_propagation": 0}})
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            done = {r.job for r in _rows(svc) if r.outcome == "ok"}
            if done >= {"retention", "sweep", "rollups"}:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive()
    assert done >= {"retention", "sweep", "rollups"}, [tuple(r) for r in _rows(svc)]
    assert all(r.outcome == "ok" for r in _rows(svc))


def test_a_crashed_run_is_abandoned_by_the_next_claim_once_its_lease_ran_out(app):
    svc = app.extensions["ledger"]
    job = ScheduledJob(name="tick", period_seconds=10, func=lambda engine, settings, clock: 1)
    clock = FixedClock(NOW)
    crashed = claim_period(svc.engine, job, instance="a", now=clock.now(), lease_seconds=30)
    assert crashed is not None  # ...and its holder dies: no finish, no renewal
    clock.advance(20)  # a later period, inside the crashed run's lease
    assert run_once(svc.engine, svc.settings, clock, job, instance="b") is runs.RunOutcome.OK
    assert [r.outcome for r in _rows(svc)] == ["running", "ok"]
    clock.advance(20)  # past the lease: the next claim of the job marks it
    assert run_once(svc.engine, svc.settings, clock, job, instance="b") is runs.RunOutcome.OK
    rows = _rows(svc)
    assert [r.outcome for r in rows] == ["abandoned", "ok", "ok"]
    assert (rows[0].finished_at, rows[0].error) == (clock.now(), runs.ABANDONED_ERROR)


def test_a_live_run_keeps_renewing_its_lease(test_env):
    """A job running three leases long is never taken for dead, by a sweep or a claim."""
    from app import create_app
    from jobs.sweep import sweep
    from ledger.clock import SystemClock

    app = create_app({**test_env, "LEDGER_LEASE_SECONDS": "1"})
    svc = app.extensions["ledger"]
    clock = SystemClock()
    swept: list[str] = []

    def long_job(engine, settings, _clock) -> int:  # type: ignore[no-untyped-def]
        for _ in range(3):
            time.sleep(1.0)
            sweep(engine, settings, clock)
            swept.append(_rows(svc)[0].outcome)
        return 1

    job = ScheduledJob(name="long", period_seconds=3600, func=long_job)
    try:
        assert run_once(svc.engine, svc.settings, clock, job,
                        instance="a") is runs.RunOutcome.OK
        assert swept == ["running"] * 3
        assert [r.outcome for r in _rows(svc)] == ["ok"]
    finally:
        svc.close()


def test_the_period_guard_holds_no_lock_past_its_transaction(pg_url, tmp_path):
    """Behind PgBouncer's transaction pooling a session lock would stay on a server
    connection that other clients then get: the guard must end with its transaction."""
    from app import create_app
    from tests.conftest import TEST_MASTER_KEY

    app = create_app({"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
                      "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "t"})
    svc = app.extensions["ledger"]
    job = ScheduledJob(name="tick", period_seconds=60, func=lambda engine, settings, clock: 0)
    clock = FixedClock(NOW)
    try:
        for instance in ("a", "b", "c"):  # a new period for each: every claim must win
            assert run_once(svc.engine, svc.settings, clock, job,
                            instance=instance) is runs.RunOutcome.OK
            clock.advance(60)
        with svc.engine.connect() as conn:
            held = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND d.datname = current_database()").scalar()
        assert held == 0
        assert [r.instance for r in _rows(svc)] == ["a", "b", "c"]
    finally:
        svc.close()
