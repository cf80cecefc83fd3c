"""Retention purge and payload expiry (jobs/retention.py, `ledger purge`), both databases."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text, update

from app import create_app
from jobs.retention import purge
from jobs.retention_batching import Pacer
from jobs.retention_receipts import expire_attempts_by_time, expire_receipts
from ledger.access import audit
from ledger.clock import FixedClock
from ledger.config import DEFAULT_RETENTION_SECONDS
from ledger.db.schema import attempts, audit_log, jobs, receipts
from ledger.domain import JobStatus, ReceiptState
from ledger.worker.requeue import requeue_receipt
from tests.conftest import TEST_MASTER_KEY
from tests.helpers import deliver, make_sender
from tests.integration.ledger_rows import add_receipt, count

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(seconds=DEFAULT_RETENTION_SECONDS + 60)
RECENT = NOW - timedelta(seconds=DEFAULT_RETENTION_SECONDS - 60)


def _seed(app):
    """Write one receipt of every kind around the retention boundary."""
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    s = sender.scope_id
    with svc.engine.begin() as conn:
        add_receipt(conn, s, "old-complete", state=ReceiptState.COMPLETE, accepted_at=OLD,
                    n_attempts=2, unsigned=True, conflict=True)
        add_receipt(conn, s, "old-failed", state=ReceiptState.FAILED, accepted_at=OLD,
                    job=JobStatus.FAILED, n_attempts=3)
        add_receipt(conn, s, "old-pending", state=ReceiptState.PENDING, accepted_at=OLD,
                    job=JobStatus.QUEUED)
        add_receipt(conn, s, "recent-complete", state=ReceiptState.COMPLETE,
                    accepted_at=RECENT)
    return svc


def test_purge_removes_finished_receipts_past_retention_with_their_history(app):
    svc = _seed(app)
    result = purge(svc.engine, svc.settings, FixedClock(NOW))
    assert result.expired_receipts == 2 and result.dry_run is False
    with svc.engine.connect() as conn:
        left = set(conn.execute(select(receipts.c.event_id)).scalars())
        assert left == {"old-pending", "recent-complete"}
        # the pending one keeps its job and history; the purged ones keep nothing
        assert count(conn, "jobs") == 1
        assert count(conn, "attempts", "event_id LIKE 'old-%' AND event_id <> 'old-pending'") == 0
        assert count(conn, "attempts", "event_id = 'old-pending'") == 1
        assert count(conn, "unsigned_bodies") == 0
        assert count(conn, "conflicts") == 0


def test_attempts_go_with_their_receipt_whenever_they_started(app):
    """Attempts leave by time and by receipt: a late retry goes, a recent receipt's stays."""
    svc = app.extensions["ledger"]
    s = make_sender(app).scope_id
    with svc.engine.begin() as conn:
        # accepted long ago, requeued, retried and completed just before the purge
        add_receipt(conn, s, "old-retried", state=ReceiptState.COMPLETE, accepted_at=OLD,
                    n_attempts=2)
        conn.execute(update(receipts).where(receipts.c.event_id == "old-retried")
                     .values(completed_at=NOW - timedelta(seconds=5)))
        conn.execute(update(attempts).where(attempts.c.event_id == "old-retried",
                                            attempts.c.number == 2)
                     .values(started_at=NOW - timedelta(seconds=10)))
        # accepted after the cutoff; its worker's clock ran a minute behind the intake's
        add_receipt(conn, s, "skewed", state=ReceiptState.COMPLETE,
                    accepted_at=NOW - timedelta(seconds=DEFAULT_RETENTION_SECONDS - 30))
        conn.execute(update(attempts).where(attempts.c.event_id == "skewed")
                     .values(started_at=NOW - timedelta(seconds=DEFAULT_RETENTION_SECONDS + 30)))
    assert purge(svc.engine, svc.settings, FixedClock(NOW)).expired_receipts == 1
    with svc.engine.connect() as conn:
        assert count(conn, "attempts", "event_id = 'old-retried'") == 0
        assert count(conn, "attempts", "event_id = 'skewed'") == 1
        assert count(conn, "receipts", "event_id = 'skewed'") == 1


def test_a_failure_requeued_while_the_purge_runs_keeps_its_attempt_history(app):
    """An operator requeues an old failure between the purge's attempts pass and its
    receipts pass: the receipt is pending again and keeps every earlier attempt."""
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    with svc.engine.begin() as conn:
        # an hour older than OLD: its attempts are past the cutoff less the clock skew
        add_receipt(conn, sender.scope_id, "old-failed", state=ReceiptState.FAILED,
                    accepted_at=OLD - timedelta(hours=1), job=JobStatus.FAILED, n_attempts=3)
        add_receipt(conn, sender.scope_id, "old-complete", state=ReceiptState.COMPLETE,
                    accepted_at=OLD - timedelta(hours=1), n_attempts=2)
    cutoff = NOW - timedelta(seconds=svc.settings.retention_seconds)
    passed = expire_attempts_by_time(svc.engine, svc.settings, cutoff, 100)
    assert passed == (2 if svc.engine.dialect.name == "postgresql" else 0)  # old-complete's
    with svc.engine.begin() as conn:
        requeue_receipt(conn, audit.Actor(name="oncall", role="admin"), scope=sender.scope,
                        event_id="old-failed", reason="downstream fixed", now=NOW)
    assert expire_receipts(svc.engine, svc.settings, cutoff, 100) == 1
    with svc.engine.connect() as conn:
        assert set(conn.execute(select(receipts.c.event_id)).scalars()) == {"old-failed"}
        assert conn.execute(select(attempts.c.number).where(
            attempts.c.event_id == "old-failed").order_by(attempts.c.number)
        ).scalars().all() == [1, 2, 3]
        assert count(conn, "attempts", "event_id = 'old-complete'") == 0


def test_a_duty_cycle_outside_zero_to_one_is_refused():
    for duty in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="duty_cycle must be > 0 and <= 1"):
            Pacer(duty)


def test_the_pacer_rests_so_batches_fill_the_duty_cycle():
    slept: list[float] = []
    Pacer(0.25, sleep=slept.append).rest(0.2)  # busy 0.2 s of every 0.8 s
    Pacer(0.5, sleep=slept.append).rest(0.1)
    Pacer(1.0, sleep=slept.append).rest(0.3)  # full speed: never sleeps
    assert slept == [pytest.approx(0.6), pytest.approx(0.1)]


def test_every_purge_batch_is_paced_and_full_speed_never_sleeps(app):
    svc = _seed(app)
    slept: list[float] = []
    batches: list[int] = []
    result = purge(svc.engine, svc.settings, FixedClock(NOW), batch_size=1,
                   on_batch=batches.append, pacer=Pacer(0.5, sleep=slept.append))
    assert result.expired_receipts == 2
    # one pause after every receipts batch (and every attempts window on PostgreSQL)
    assert len(slept) >= len(batches) >= 1 and all(pause > 0 for pause in slept)
    full_speed: list[float] = []
    later = FixedClock(NOW + timedelta(minutes=2))  # "recent-complete" has expired too
    again = purge(svc.engine, svc.settings, later, pacer=Pacer(1.0, sleep=full_speed.append))
    assert again.expired_receipts == 1 and full_speed == []


def test_dry_run_counts_without_deleting(app):
    svc = _seed(app)
    dry = purge(svc.engine, svc.settings, FixedClock(NOW), dry_run=True)
    # review window = min(14 days, retention of ~7 days): the old failed payload is due
    assert dry.to_json() == {"expired_receipts": 2, "payloads_dropped": 1, "dry_run": True}
    with svc.engine.connect() as conn:
        assert count(conn, "receipts") == 4
    real = purge(svc.engine, svc.settings, FixedClock(NOW))
    assert (real.expired_receipts, real.payloads_dropped) == (2, 1)


def test_purge_in_small_batches_reaches_everything(app):
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    with svc.engine.begin() as conn:
        for i in range(23):
            add_receipt(conn, sender.scope_id, f"e{i}", state=ReceiptState.COMPLETE,
                        accepted_at=OLD - timedelta(seconds=i))
    seen: list[int] = []
    result = purge(svc.engine, svc.settings, FixedClock(NOW), batch_size=5,
                   on_batch=seen.append)
    assert result.expired_receipts == 23
    if svc.engine.dialect.name == "sqlite":
        assert seen == [5, 10, 15, 20, 23]
    else:  # PostgreSQL deletes by page window (at least a page; these 23 rows fill one)
        assert seen[-1] == 23 and seen == sorted(seen)
    with svc.engine.connect() as conn:
        assert count(conn, "receipts") == 0 and count(conn, "attempts") == 0


def test_many_small_batches_keep_every_rule_at_their_edges(app):
    """Pending, failed, conflicted and unsigned receipts mixed over several pages and batches."""
    svc = app.extensions["ledger"]
    s = make_sender(app).scope_id
    kinds: dict[str, str] = {}
    with svc.engine.begin() as conn:
        for i in range(300):
            eid, at = f"m{i:03d}", OLD - timedelta(seconds=i)
            if i % 7 == 0:
                kinds[eid] = "pending"
                add_receipt(conn, s, eid, state=ReceiptState.PENDING, accepted_at=at,
                            job=JobStatus.QUEUED, n_attempts=2)
            elif i % 5 == 0:
                kinds[eid] = "failed"
                add_receipt(conn, s, eid, state=ReceiptState.FAILED, accepted_at=at,
                            job=JobStatus.FAILED, n_attempts=3)
            else:
                kinds[eid] = "complete"
                add_receipt(conn, s, eid, state=ReceiptState.COMPLETE, accepted_at=at,
                            conflict=i % 11 == 0, unsigned=i % 13 == 0)
        # what the worker writes on completion: the purge trusts it to skip the lookup
        conn.execute(update(attempts).where(attempts.c.event_id.in_(
            [e for e, k in kinds.items() if k == "complete"])).values(outcome="complete"))
    seen: list[int] = []
    result = purge(svc.engine, svc.settings, FixedClock(NOW), batch_size=20,
                   on_batch=seen.append, pacer=Pacer(1.0))
    pending = {e for e, k in kinds.items() if k == "pending"}
    assert result.expired_receipts == 300 - len(pending)
    assert len(seen) > 1 and seen == sorted(seen) and seen[-1] == result.expired_receipts
    with svc.engine.connect() as conn:
        assert set(conn.execute(select(receipts.c.event_id)).scalars()) == pending
        assert set(conn.execute(select(jobs.c.event_id)).scalars()) == pending
        assert set(conn.execute(select(attempts.c.event_id)).scalars()) == pending
        assert count(conn, "attempts") == 2 * len(pending)
        assert count(conn, "unsigned_bodies") == 0 and count(conn, "conflicts") == 0


def test_expired_receipts_between_recent_ones_are_all_found(app):
    """Old rows stored between new ones (PostgreSQL: the middle pages of the heap)."""
    svc = app.extensions["ledger"]
    s = make_sender(app).scope_id
    with svc.engine.begin() as conn:
        for i in range(360):
            at = OLD - timedelta(seconds=i) if 120 <= i < 240 else RECENT + timedelta(seconds=i)
            add_receipt(conn, s, f"r{i:03d}", state=ReceiptState.COMPLETE, accepted_at=at)
    result = purge(svc.engine, svc.settings, FixedClock(NOW), batch_size=40,
                   pacer=Pacer(1.0))
    assert result.expired_receipts == 120
    with svc.engine.connect() as conn:
        left = set(conn.execute(select(receipts.c.event_id)).scalars())
        assert left == {f"r{i:03d}" for i in (*range(120), *range(240, 360))}
        assert count(conn, "attempts") == 240


def test_failed_payload_is_dropped_after_the_review_window_but_the_receipt_stays(test_env):
    # retention 30 days, so the 14-day review window is the shorter one
    app = create_app({**test_env, "LEDGER_RETENTION_SECONDS": str(30 * 86400)})
    try:
        svc = app.extensions["ledger"]
        sender = make_sender(app)
        with svc.engine.begin() as conn:
            add_receipt(conn, sender.scope_id, "reviewed", state=ReceiptState.FAILED,
                        accepted_at=NOW - timedelta(days=15), job=JobStatus.FAILED)
            add_receipt(conn, sender.scope_id, "in-review", state=ReceiptState.FAILED,
                        accepted_at=NOW - timedelta(days=13), job=JobStatus.FAILED)
            add_receipt(conn, sender.scope_id, "queued", state=ReceiptState.PENDING,
                        accepted_at=NOW - timedelta(days=15), job=JobStatus.QUEUED)
        result = purge(svc.engine, svc.settings, FixedClock(NOW))
        assert (result.expired_receipts, result.payloads_dropped) == (0, 1)
        with svc.engine.connect() as conn:
            payloads = dict(conn.execute(select(jobs.c.event_id, jobs.c.payload)).all())
            assert payloads["reviewed"] is None
            assert payloads["in-review"] is not None and payloads["queued"] is not None
            assert count(conn, "receipts") == 3
        again = purge(svc.engine, svc.settings, FixedClock(NOW))
        assert again.payloads_dropped == 0
    finally:
        app.extensions["ledger"].close()


@pytest.mark.parametrize("profile", ["stripe", "github"])
def test_a_replay_after_expiry_becomes_new_work(app, client, profile):
    """The seed's stated consequence: past retention the ledger cannot prove the event ran."""
    svc = app.extensions["ledger"]
    sender = make_sender(app, profile=profile)
    first = deliver(client, sender, "evt_boundary")
    assert first.status_code == 202
    with svc.engine.begin() as conn:  # the worker's outcome: complete, job deleted
        conn.execute(update(receipts).values(state=ReceiptState.COMPLETE.code,
                                             result_ref="credit:1",
                                             completed_at=svc.clock.now()))
        conn.execute(jobs.delete())
    inside = deliver(client, sender, "evt_boundary")
    assert inside.status_code == 200 and inside.get_json()["status"] == "duplicate"

    later = svc.clock.now() + timedelta(seconds=svc.settings.retention_seconds + 1)
    assert purge(svc.engine, svc.settings, FixedClock(later)).expired_receipts == 1
    replay = deliver(client, sender, "evt_boundary")
    assert replay.status_code == 202
    assert replay.get_json() == {"status": "accepted", "event_id": "evt_boundary",
                                 "state": "pending"}
    with svc.engine.connect() as conn:
        fresh = conn.execute(select(receipts)).one()
    assert fresh.state == ReceiptState.PENDING.code and fresh.attempts == 0


def test_purge_command_prints_the_contract_json_and_audits(app, runner):
    svc = _seed(app)
    # the app's clock is the wall clock: make the seeded rows old relative to it
    shift = datetime.now(UTC) - NOW
    with svc.engine.begin() as conn:
        for row in conn.execute(select(receipts.c.event_id, receipts.c.accepted_at)).all():
            conn.execute(update(receipts).where(receipts.c.event_id == row.event_id)
                         .values(accepted_at=row.accepted_at + shift))
        conn.execute(update(jobs).values(accepted_at=OLD + shift))
    dry = runner.invoke(args=["ledger", "purge", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output) == {"expired_receipts": 2, "payloads_dropped": 1,
                                      "dry_run": True}
    real = runner.invoke(args=["ledger", "purge", "--json"])
    assert json.loads(real.output) == {"expired_receipts": 2, "payloads_dropped": 1,
                                       "dry_run": False}
    with svc.engine.connect() as conn:
        entry = conn.execute(select(audit_log).where(audit_log.c.action == "receipts.purge")
                             ).one()
    assert entry.actor.startswith("cli:")
    assert json.loads(entry.detail)["expired_receipts"] == 2
    empty = runner.invoke(args=["ledger", "purge", "--json"])
    assert json.loads(empty.output)["expired_receipts"] == 0


@pytest.mark.slow
def test_ingestion_keeps_answering_during_a_purge_of_50k_receipts(pg_url, tmp_path):
    """PostgreSQL: short batch transactions never hold the intake up (1M rows: bench/)."""
    app = create_app({"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
                      "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "k"})
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    old = datetime.now(UTC) - timedelta(seconds=svc.settings.retention_seconds + 3600)
    with svc.engine.begin() as conn:
        conn.execute(text("""
            INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts,
                                  event_id, event_type, body_sha256, result_ref)
            SELECT :old + i * interval '1 ms', :old, :s, 1, 1, 'old_' || i, 'demo.credit',
                   sha256(i::text::bytea), 'credit:1'
            FROM generate_series(1, 50000) AS i"""), {"old": old, "s": sender.scope_id})
        conn.execute(text("""
            INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token,
                                  started_at, finished_at, outcome)
            SELECT :s, 'old_' || i, 1, 'w', 1, :old, :old, 'ok'
            FROM generate_series(1, 50000) AS i"""), {"old": old, "s": sender.scope_id})
    client = app.test_client()
    answers: list[int] = []
    purging = threading.Event()

    def deliver_until_done() -> None:
        n = 0
        while purging.is_set() or n < 5:
            answers.append(deliver(client, sender, f"live_{n}").status_code)
            n += 1

    seen = [0]

    def wait_for_a_delivery(_total: int) -> None:
        # between two batches at least one delivery completes: the purge never
        # starves the intake, and deliveries also run while a batch executes
        deadline = time.monotonic() + 10
        while len(answers) <= seen[0] and time.monotonic() < deadline:
            time.sleep(0.001)
        seen[0] = len(answers)

    purging.set()
    delivering = threading.Thread(target=deliver_until_done)
    delivering.start()
    try:
        result = purge(svc.engine, svc.settings, svc.clock, batch_size=2000,
                       on_batch=wait_for_a_delivery)
    finally:
        purging.clear()
        delivering.join(timeout=30)
    try:
        assert result.expired_receipts == 50_000
        assert len(answers) >= 25 and set(answers) == {202}
        with svc.engine.connect() as conn:
            assert count(conn, "receipts") == len(answers)
            assert count(conn, "attempts") == 0
    finally:
        svc.close()
