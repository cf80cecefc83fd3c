"""The worker on both databases: completion, retries, terminal states, requeue, poison events."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from app import create_app
from ledger.access.audit import verify_chain
from ledger.clock import FixedClock, unix
from ledger.db.schema import attempts, audit_log, jobs
from ledger.demo.seed import balance
from ledger.reads.receipts import get_receipt, receipt_detail
from ledger.worker.loop import WorkerHooks, process_one
from tests.helpers import deliver, make_sender, send


class FixedRandom:
    """An RNG that always answers the same fraction."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        """Return the fixed fraction."""
        return self.value


class SimulatedCrash(BaseException):
    """Stands for a worker dying mid-job: nothing catches it, nothing is recorded."""


@pytest.fixture
def make_app(test_env):
    """Build apps on the test database with a FixedClock and extra settings."""
    made = []

    def factory(**env: str):
        app = create_app({**test_env, **env}, clock=FixedClock(datetime.now(UTC)))
        made.append(app)
        return app

    yield factory
    for app in made:
        app.extensions["ledger"].close()


def _receipt(app, sender, event_id):
    with app.extensions["ledger"].engine.connect() as conn:
        return get_receipt(conn, sender.scope, event_id)


def _history(app, sender, event_id):
    with app.extensions["ledger"].engine.connect() as conn:
        return [(r.number, r.outcome, r.error) for r in conn.execute(
            select(attempts).where(attempts.c.scope_id == sender.scope_id,
                                   attempts.c.event_id == event_id)
            .order_by(attempts.c.number)).all()]


def _job(app, sender, event_id):
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(jobs).where(jobs.c.scope_id == sender.scope_id,
                                               jobs.c.event_id == event_id)).first()


def _balance(app, sender):
    with app.extensions["ledger"].engine.connect() as conn:
        return balance(conn, sender.scope_id)


def _drain(app, rng=None, hooks=None):
    """Process every due job; return how many ran."""
    svc = app.extensions["ledger"]
    count = 0
    while process_one(svc, "w-test", rng=rng or FixedRandom(0.5), hooks=hooks):
        count += 1
        assert count < 1000
    return count


def test_credit_completes_once_and_its_payload_leaves(make_app):
    app = make_app()
    sender = make_sender(app)
    send(app, sender, "evt_1", data={"amount": 5}, expect=202)
    send(app, sender, "evt_2", data={"amount": 7}, expect=202)
    assert _drain(app) == 2
    assert _balance(app, sender) == 12
    receipt = _receipt(app, sender, "evt_1")
    assert (receipt.state.value, receipt.result_ref, receipt.attempts) == (
        "complete", "credit:5", 1)
    assert receipt.completed_at is not None
    assert _job(app, sender, "evt_1") is None  # the payload left the hot ledger
    assert _history(app, sender, "evt_1") == [(1, "complete", None)]
    duplicate = deliver(app.test_client(), sender, "evt_1", "demo.credit", {"amount": 5},
                        timestamp=unix(app.extensions["ledger"].clock.now()))
    assert (duplicate.status_code, duplicate.get_json()["result_ref"]) == (200, "credit:5")
    assert _drain(app) == 0
    assert _balance(app, sender) == 12


def test_type_without_handler_completes_as_ignored(make_app):
    app = make_app()
    sender = make_sender(app)
    send(app, sender, "evt_x", "invoice.paid", {"amount": 5}, expect=202)
    assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_x")
    assert (receipt.state.value, receipt.result_ref) == ("complete", "ignored:no-handler")


def test_demo_handlers_are_absent_unless_enabled(make_app):
    app = make_app(LEDGER_DEMO_HANDLERS="0")
    sender = make_sender(app)
    send(app, sender, "evt_c", "demo.credit", {"amount": 5}, expect=202)
    _drain(app)
    assert _receipt(app, sender, "evt_c").result_ref == "ignored:no-handler"
    assert _balance(app, sender) == 0


def test_flaky_retries_with_backoff_then_credits(make_app):
    app = make_app(LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_f", "demo.flaky", {"amount": 3, "fail_times": 2}, expect=202)
    assert _drain(app) == 1
    # Full jitter with the injected RNG at 0.5: half of min(cap, 10 * 2^0).
    assert _job(app, sender, "evt_f").run_at == clock.now() + timedelta(seconds=5)
    assert _receipt(app, sender, "evt_f").state.value == "pending"
    clock.advance(4.9)
    assert _drain(app) == 0  # not due yet
    clock.advance(0.1)
    assert _drain(app) == 1
    assert _job(app, sender, "evt_f").run_at == clock.now() + timedelta(seconds=10)
    clock.advance(10)
    assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_f")
    assert (receipt.state.value, receipt.result_ref, receipt.attempts) == (
        "complete", "credit:3", 3)
    assert [(n, o) for n, o, _ in _history(app, sender, "evt_f")] == [
        (1, "retry"), (2, "retry"), (3, "complete")]
    assert _history(app, sender, "evt_f")[0][2] == "DemoFailure: demo.flaky fails attempt 1 of 2"
    assert _balance(app, sender) == 3


def _terminal_count(event_type: str) -> float:
    value = REGISTRY.get_sample_value("ledger_terminal_failures_total",
                                      {"event_type": event_type})
    return value or 0.0


def test_terminal_at_max_attempts_keeps_payload_for_review(make_app):
    app = make_app(LEDGER_MAX_ATTEMPTS="3", LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_p", "demo.fail", {}, expect=202)
    before = _terminal_count("demo.fail")
    for _ in range(3):
        assert _drain(app) == 1
        clock.advance(3600)
    receipt = _receipt(app, sender, "evt_p")
    assert (receipt.state.value, receipt.attempts) == ("failed", 3)
    assert receipt.last_error == "DemoFailure: demo.fail always fails"
    job = _job(app, sender, "evt_p")
    assert job.status == 1 and json.loads(job.payload) == {
        "id": "evt_p", "object": "event", "type": "demo.fail", "data": {}}
    assert [o for _, o, _ in _history(app, sender, "evt_p")] == ["retry", "retry", "failed"]
    assert _terminal_count("demo.fail") == before + 1
    clock.advance(86400)
    assert _drain(app) == 0  # terminal: never claimed again
    duplicate = deliver(app.test_client(), sender, "evt_p", "demo.fail", {},
                        timestamp=unix(clock.now()))
    assert (duplicate.status_code, duplicate.get_json()["state"]) == (200, "failed")


def test_terminal_at_max_event_age(make_app):
    app = make_app(LEDGER_MAX_EVENT_AGE_SECONDS="100", LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_old", "demo.fail", {}, expect=202)
    assert _drain(app) == 1  # attempt 1 fails, retry due 5 s later
    clock.advance(200)  # the workers were away: the retry is now too old to start
    assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_old")
    assert (receipt.state.value, receipt.attempts) == ("failed", 1)
    assert receipt.last_error.startswith("MaxEventAgeExceeded: event is 200s old")
    assert [o for _, o, _ in _history(app, sender, "evt_old")] == ["retry", "not-run"]


def test_retry_that_would_start_past_max_age_fails_at_once(make_app):
    app = make_app(LEDGER_MAX_EVENT_AGE_SECONDS="100", LEDGER_RETRY_BASE_SECONDS="1000",
                   LEDGER_RETRY_CAP_SECONDS="1000")
    sender = make_sender(app)
    send(app, sender, "evt_far", "demo.fail", {}, expect=202)
    assert _drain(app) == 1  # the retry would wait 500 s: past the 100 s age limit
    receipt = _receipt(app, sender, "evt_far")
    assert (receipt.state.value, receipt.last_error) == (
        "failed", "DemoFailure: demo.fail always fails")


def _crash(_conn, _event):
    raise SimulatedCrash()


def test_crashes_count_as_attempts_so_a_killer_job_still_fails(make_app):
    app = make_app(LEDGER_MAX_ATTEMPTS="2", LEDGER_LEASE_SECONDS="60")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_k", data={"amount": 5}, expect=202)
    for _ in range(2):
        with pytest.raises(SimulatedCrash):
            _drain(app, hooks=WorkerHooks(before_commit=_crash))
        assert _drain(app) == 0  # leased: nobody else may take it yet
        clock.advance(61)
    assert _drain(app) == 1  # the third claim finds two attempts spent
    receipt = _receipt(app, sender, "evt_k")
    assert (receipt.state.value, receipt.attempts) == ("failed", 2)
    assert receipt.last_error.startswith("MaxAttemptsExceeded")
    assert [o for _, o, _ in _history(app, sender, "evt_k")] == ["lost", "lost", "not-run"]
    assert _balance(app, sender) == 0  # the crashed transactions never committed


def test_crashed_worker_job_is_claimable_after_its_lease(make_app, caplog):
    app = make_app(LEDGER_LEASE_SECONDS="60")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_l", data={"amount": 9}, expect=202)
    with pytest.raises(SimulatedCrash):
        _drain(app, hooks=WorkerHooks(before_commit=_crash))
    clock.advance(59)
    assert _drain(app) == 0
    clock.advance(2)
    with caplog.at_level(logging.INFO, logger="ledger"):
        assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_l")
    assert (receipt.state.value, receipt.result_ref, receipt.attempts) == (
        "complete", "credit:9", 2)
    assert [(n, o) for n, o, _ in _history(app, sender, "evt_l")] == [(1, "lost"), (2, "complete")]
    # The operator's log shows the lost attempt when the next claim finds it.
    assert [(line["attempt"], line["to_state"]) for line in _transitions(caplog)] == [
        (1, "lost"), (2, "complete")]


def _database_error(_conn, _event):
    """Stands for the database failing the completion (a full disk, a lost connection)."""
    raise sa_exc.OperationalError("COMMIT", None, OSError("disk I/O error"))


def test_database_errors_in_the_completion_spend_no_attempt(make_app):
    """LEDGER_MAX_ATTEMPTS=2 and two database errors: the event still completes, once."""
    app = make_app(LEDGER_MAX_ATTEMPTS="2", LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_db", data={"amount": 5}, expect=202)
    for number in (1, 2):
        assert _drain(app, hooks=WorkerHooks(before_commit=_database_error)) == 1
        job = _job(app, sender, "evt_db")
        # The attempt went back to the budget; the wait grows with the history.
        assert job.attempts == 0 and job.leased_by is None
        assert job.run_at == clock.now() + timedelta(seconds=5 * number)
        clock.advance(5 * number)
    assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_db")
    assert (receipt.state.value, receipt.result_ref, receipt.attempts) == (
        "complete", "credit:5", 3)
    assert _history(app, sender, "evt_db") == [
        (1, "interrupted", "OSError: disk I/O error"),
        (2, "interrupted", "OSError: disk I/O error"), (3, "complete", None)]
    assert _balance(app, sender) == 5
    duplicate = deliver(app.test_client(), sender, "evt_db", "demo.credit", {"amount": 5},
                        timestamp=unix(clock.now()))
    assert (duplicate.status_code, duplicate.get_json()["state"]) == (200, "complete")


def test_database_errors_are_still_bounded_by_the_events_age(make_app):
    app = make_app(LEDGER_MAX_EVENT_AGE_SECONDS="100", LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_db_old", data={"amount": 5}, expect=202)
    assert _drain(app, hooks=WorkerHooks(before_commit=_database_error)) == 1
    clock.advance(96)  # the next wait (up to 10 s, 5 s here) would end past the age limit
    assert _drain(app, hooks=WorkerHooks(before_commit=_database_error)) == 1
    receipt = _receipt(app, sender, "evt_db_old")
    assert (receipt.state.value, receipt.attempts) == ("failed", 2)
    assert [o for _, o, _ in _history(app, sender, "evt_db_old")] == ["interrupted", "failed"]
    assert _balance(app, sender) == 0


def test_a_complete_receipt_shows_no_superseded_error(make_app):
    app = make_app(LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_f2", "demo.flaky", {"amount": 3, "fail_times": 1}, expect=202)
    assert _drain(app) == 1
    assert _receipt(app, sender, "evt_f2").last_error == (
        "DemoFailure: demo.flaky fails attempt 1 of 1")  # pending: why it waits
    clock.advance(10)
    assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_f2")
    assert (receipt.state.value, receipt.last_error) == ("complete", None)
    with app.extensions["ledger"].engine.connect() as conn:
        detail = receipt_detail(conn, sender.scope_id, "evt_f2")
    assert detail["last_error"] is None
    assert [a["error"] for a in detail["attempt_rows"]] == [
        "DemoFailure: demo.flaky fails attempt 1 of 1", None]  # the history keeps it
    result = app.test_cli_runner().invoke(args=["ledger", "receipt", "show", "--scope",
                                                sender.scope, "--event-id", "evt_f2", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["last_error"] is None


def test_poison_event_does_not_block_good_ones(make_app):
    app = make_app(LEDGER_RETRY_BASE_SECONDS="10")
    clock = app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_poison", "demo.fail", {}, expect=202)
    for n in range(5):
        clock.advance(1)
        send(app, sender, f"evt_good_{n}", data={"amount": n + 1}, expect=202)
    assert _drain(app) == 6
    assert all(_receipt(app, sender, f"evt_good_{n}").state.value == "complete"
               for n in range(5))
    assert _receipt(app, sender, "evt_poison").state.value == "pending"  # still retrying
    send(app, sender, "evt_late", data={"amount": 100}, expect=202)
    clock.advance(5)
    assert _drain(app) == 2  # the poison's retry and the late good event
    assert _receipt(app, sender, "evt_late").state.value == "complete"
    assert _balance(app, sender) == 115
    assert _receipt(app, sender, "evt_poison").attempts == 2


def _fail_to_terminal(app, sender, event_id):
    clock = app.extensions["ledger"].clock
    while _receipt(app, sender, event_id).state.value == "pending":
        assert _drain(app) >= 1
        clock.advance(3600)


def test_requeue_keeps_history_and_is_audited(make_app):
    app = make_app(LEDGER_MAX_ATTEMPTS="2")
    sender = make_sender(app)
    send(app, sender, "evt_r", "demo.flaky", {"amount": 4, "fail_times": 2}, expect=202)
    _fail_to_terminal(app, sender, "evt_r")
    assert _receipt(app, sender, "evt_r").attempts == 2
    result = app.test_cli_runner().invoke(args=[
        "ledger", "receipt", "requeue", "--scope", sender.scope, "--event-id", "evt_r",
        "--reason", "downstream fixed", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"scope": sender.scope, "event_id": "evt_r",
                                         "state": "pending"}
    job = _job(app, sender, "evt_r")
    assert (job.status, job.attempts) == (0, 0)
    assert job.run_at == app.extensions["ledger"].clock.now()  # due now
    assert _drain(app) == 1
    receipt = _receipt(app, sender, "evt_r")
    assert (receipt.state.value, receipt.result_ref, receipt.attempts) == (
        "complete", "credit:4", 3)
    assert [(n, o) for n, o, _ in _history(app, sender, "evt_r")] == [
        (1, "retry"), (2, "failed"), (3, "complete")]
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(audit_log).where(audit_log.c.action == "receipt.requeue")).all()
        assert verify_chain(conn)["ok"]
    assert [(r.target, r.reason, r.scope) for r in rows] == [
        (f"{sender.scope}:evt_r", "downstream fixed", sender.scope)]


def _requeue(app, *args):
    result = app.test_cli_runner().invoke(args=["ledger", "receipt", "requeue", *args, "--json"])
    return result.exit_code, json.loads(result.output.splitlines()[0])


def _requeue_audits(app):
    with app.extensions["ledger"].engine.connect() as conn:
        return len(conn.execute(select(audit_log.c.id)
                                .where(audit_log.c.action == "receipt.requeue")).all())


def test_requeue_refuses_what_it_cannot_do(make_app):
    app = make_app(LEDGER_MAX_ATTEMPTS="1", LEDGER_REVIEW_WINDOW_SECONDS="86400")
    sender = make_sender(app)
    send(app, sender, "evt_pending", data={"amount": 1}, expect=202)
    code, answer = _requeue(app, "--scope", sender.scope, "--event-id", "evt_pending",
                            "--reason", "why not")
    assert (code, answer["error"]) == (1, "refused")
    assert "only failed receipts" in answer["detail"]
    code, answer = _requeue(app, "--scope", sender.scope, "--event-id", "nope", "--reason", "x")
    assert (code, answer["error"]) == (1, "not_found")
    send(app, sender, "evt_dead", "demo.fail", {}, expect=202)
    _fail_to_terminal(app, sender, "evt_dead")
    code, answer = _requeue(app, "--scope", sender.scope, "--event-id", "evt_dead",
                            "--reason", "  ")
    assert (code, answer["error"]) == (1, "refused")
    assert "reason is required" in answer["detail"]
    app.extensions["ledger"].clock.advance(86401)  # the review window is over
    code, answer = _requeue(app, "--scope", sender.scope, "--event-id", "evt_dead",
                            "--reason", "too late")
    assert (code, answer["error"]) == (1, "refused")
    assert "review window" in answer["detail"]
    assert _requeue_audits(app) == 0
    assert _receipt(app, sender, "evt_dead").state.value == "failed"


def test_requeue_refused_once_the_payload_was_dropped(make_app):
    app = make_app(LEDGER_MAX_ATTEMPTS="1")
    sender = make_sender(app)
    send(app, sender, "evt_gone", "demo.fail", {}, expect=202)
    _fail_to_terminal(app, sender, "evt_gone")
    with app.extensions["ledger"].engine.begin() as conn:  # what the retention purge does
        conn.execute(jobs.update().where(jobs.c.event_id == "evt_gone").values(payload=None))
    code, answer = _requeue(app, "--scope", sender.scope, "--event-id", "evt_gone",
                            "--reason", "retry")
    assert (code, answer["error"]) == (1, "refused")
    assert "payload" in answer["detail"] and "dropped" in answer["detail"]
    assert _requeue_audits(app) == 0


def _transitions(caplog) -> list[dict]:
    """Return the worker's job.transition lines captured so far."""
    return [json.loads(r.getMessage()) for r in caplog.records
            if r.name == "ledger.worker" and "job.transition" in r.getMessage()]


def test_transition_logs_are_privacy_safe(make_app, caplog):
    app = make_app()
    sender = make_sender(app)
    send(app, sender, "evt_secret_id", "demo.fail", {"amount": 31337}, expect=202)
    with caplog.at_level(logging.INFO, logger="ledger"):
        _drain(app)
    info = _transitions(caplog)
    # One line per attempt at INFO, when it ends; its start too with debug on.
    assert [(line["from_state"], line["to_state"]) for line in info] == [
        ("running", "retrying")]
    caplog.clear()
    app.extensions["ledger"].clock.advance(3600)
    with caplog.at_level(logging.DEBUG, logger="ledger"):
        _drain(app)
    debug = _transitions(caplog)
    assert [(line["from_state"], line["to_state"], line["level"]) for line in debug] == [
        ("queued", "running", "debug"), ("running", "retrying", "info")]
    for line in info + debug:
        assert line["scope"] == sender.scope and line["event_ref"].startswith("ev_")
        assert line["attempt"] == (1 if line in info else 2)
        assert line["event_type"] == "demo.fail" and line["event_age_seconds"] >= 0
    text = caplog.text
    assert "evt_secret_id" not in text and "31337" not in text


@pytest.mark.parametrize("size", [1, 16])
def test_claim_query_can_use_the_due_index(pg_url, tmp_path, size):
    from ledger.worker.sql import CLAIM_ONE_SQL, CLAIM_SQL
    from tests.conftest import TEST_MASTER_KEY

    app = create_app({"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
                      "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "t"})
    svc = app.extensions["ledger"]

    with svc.engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        now = svc.clock.now()
        compiled = (CLAIM_ONE_SQL if size == 1 else CLAIM_SQL).compile(conn)
        params = {"now": now, "leased_until": now, "oldest_window": now, "max_attempts": 8,
                  "worker_id": "w", "batch": size, "alone_types": "{}"}
        plan = "\n".join(row[0] for row in conn.exec_driver_sql(
            f"EXPLAIN {compiled.string}", compiled.construct_params(params)))
    svc.close()
    assert "ix_jobs_due" in plan and "LockRows" in plan, plan


def test_handler_that_writes_then_raises_leaves_no_effect(make_app):
    from ledger.demo.handlers import credit
    from ledger.worker.handlers import Registry

    def credit_then_fail(conn, event):
        credit(conn, event)
        raise RuntimeError("downstream said no")

    def credit_with_a_huge_ref(conn, event):
        credit(conn, event)
        return "x" * 10_000

    app = make_app()
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    send(app, sender, "evt_w1", "t.raise", {"amount": 5}, expect=202)
    send(app, sender, "evt_w2", "t.huge", {"amount": 5}, expect=202)
    registry = Registry.of({"t.raise": credit_then_fail, "t.huge": credit_with_a_huge_ref})
    while process_one(svc, "w-test", handlers=registry, rng=FixedRandom(0.5)):
        pass
    assert _balance(app, sender) == 0
    assert _history(app, sender, "evt_w1") == [(1, "retry", "RuntimeError: downstream said no")]
    (number, outcome, error), = _history(app, sender, "evt_w2")
    assert (number, outcome) == (1, "retry") and error.startswith("TypeError: handler of t.huge")
    assert {_receipt(app, sender, e).state.value for e in ("evt_w1", "evt_w2")} == {"pending"}


USER_HANDLERS = '''
from ledger.worker.handlers import handler

SEEN = []

def remember(event):
    SEEN.append(event.idempotency_key)  # where a downstream call would carry it
    return {"remote_id": "r-1"}

@handler("invoice.paid", prepare=remember)
def mark_paid(conn, event):
    return f"invoice:{event.prepared['remote_id']}:{event.payload['data']['amount']}"
'''


def test_user_handler_modules_are_loaded_and_get_the_idempotency_key(
        make_app, tmp_path, monkeypatch):
    import importlib
    import uuid

    name = f"acme_handlers_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(USER_HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    app = make_app(LEDGER_HANDLER_MODULES=name)
    sender = make_sender(app)
    send(app, sender, "evt_inv", "invoice.paid", {"amount": 12}, expect=202)
    assert _drain(app) == 1
    assert _receipt(app, sender, "evt_inv").result_ref == "invoice:r-1:12"
    assert [f"{sender.scope}:evt_inv"] == importlib.import_module(name).SEEN
    # Another app without the module does not pick its handler up from this process.
    other = make_app()
    other_sender = make_sender(other, account="other")
    send(other, other_sender, "evt_inv", "invoice.paid", {"amount": 12}, expect=202)
    assert _drain(other) == 1
    assert _receipt(other, other_sender, "evt_inv").result_ref == "ignored:no-handler"


def test_worker_refuses_a_handler_module_it_cannot_import(make_app):
    app = make_app(LEDGER_HANDLER_MODULES="no_such_module_anywhere")
    result = app.test_cli_runner().invoke(args=["ledger", "worker", "--burst"])
    assert result.exit_code == 2
    assert "no_such_module_anywhere" in result.output
