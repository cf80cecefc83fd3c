"""Fencing and the run loop: a worker whose lease was taken over commits nothing."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from app import create_app
from ledger.clock import FixedClock
from ledger.db.schema import attempts, jobs
from ledger.demo.handlers import credit
from ledger.demo.seed import balance
from ledger.reads.receipts import get_receipt
from ledger.worker.handlers import HandlerSpec, Registry
from ledger.worker.loop import Worker, WorkerHooks, run_worker
from tests.helpers import WAIT, deliver, make_sender, send


@pytest.fixture
def fixed_app(test_env):
    """The app with a FixedClock and a 60 s lease."""
    app = create_app({**test_env, "LEDGER_LEASE_SECONDS": "60"},
                     clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


def _state(app, sender, event_id):
    svc = app.extensions["ledger"]
    with svc.engine.connect() as conn:
        receipt = get_receipt(conn, sender.scope, event_id)
        history = [(r.number, r.worker_id, r.outcome) for r in conn.execute(
            select(attempts).where(attempts.c.event_id == event_id)
            .order_by(attempts.c.number)).all()]
        job = conn.execute(select(jobs.c.event_id).where(jobs.c.event_id == event_id)).first()
        return receipt, history, job, balance(conn, sender.scope_id)


class CountingCredit:
    """demo.credit that counts how often its transaction body ran."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, conn, event) -> str:
        self.calls.append(threading.current_thread().name)
        return credit(conn, event)


def test_late_commit_after_takeover_is_refused_while_b_holds_the_lease(fixed_app):
    """A pauses after its claim, its lease expires, B claims; A's commit changes nothing."""
    app, clock = fixed_app, fixed_app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_fence", data={"amount": 5}, expect=202)
    paused = {1: (threading.Event(), threading.Event()), 2: (threading.Event(), threading.Event())}

    def pause(event) -> None:  # the out-of-transaction step: where slow work happens
        claimed, go = paused[event.attempt]
        claimed.set()
        assert go.wait(WAIT)

    apply = CountingCredit()
    registry = Registry({"demo.credit": HandlerSpec(event_type="demo.credit", apply=apply,
                                                    prepare=pause)})
    svc = app.extensions["ledger"]
    worker_a = Worker(svc, worker_id="worker-a", handlers=registry)
    worker_b = Worker(svc, worker_id="worker-b", handlers=registry)
    thread_a = threading.Thread(target=worker_a.process_one, name="A")
    thread_b = threading.Thread(target=worker_b.process_one, name="B")
    thread_a.start()
    assert paused[1][0].wait(WAIT)
    clock.advance(61)  # A's lease is over
    thread_b.start()
    assert paused[2][0].wait(WAIT)  # B took the job over
    paused[1][1].set()  # A wakes up and tries to commit
    thread_a.join(WAIT)
    receipt, history, job, credited = _state(app, sender, "evt_fence")
    assert (receipt.state.value, credited, job is not None) == ("pending", 0, True)
    # A's handler ran (the fence is the completion's last statement), but the
    # fence refused A's commit and its transaction rolled back, credit included.
    assert apply.calls == ["A"]
    paused[2][1].set()
    thread_b.join(WAIT)
    receipt, history, job, credited = _state(app, sender, "evt_fence")
    assert (receipt.state.value, receipt.result_ref, credited, job) == (
        "complete", "credit:5", 5, None)
    assert history == [(1, "worker-a", "lost"), (2, "worker-b", "complete")]
    assert apply.calls == ["A", "B"]


def test_late_commit_after_b_completed_changes_nothing(fixed_app):
    """B takes over and finishes while A sleeps; A's late commit is refused: credited once."""
    app, clock = fixed_app, fixed_app.extensions["ledger"].clock
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    send(app, sender, "evt_once", data={"amount": 8}, expect=202)
    apply = CountingCredit()
    worker_b = Worker(svc, worker_id="worker-b",
                      handlers=Registry({"demo.credit": HandlerSpec(event_type="demo.credit",
                                                                    apply=apply)}))

    def stall(event) -> None:
        clock.advance(61)  # A stalls past its lease ...
        assert worker_b.process_one()  # ... and B runs the whole job meanwhile

    worker_a = Worker(svc, worker_id="worker-a", handlers=Registry({"demo.credit": HandlerSpec(
        event_type="demo.credit", apply=apply, prepare=stall)}))
    assert worker_a.process_one()
    receipt, history, job, credited = _state(app, sender, "evt_once")
    assert (receipt.state.value, receipt.result_ref, credited, job) == (
        "complete", "credit:8", 8, None)
    assert history == [(1, "worker-a", "lost"), (2, "worker-b", "complete")]
    assert len(apply.calls) == 2  # B's committed; A's ran after B's and rolled back


def test_burst_runs_every_due_job_then_exits_zero(app, runner):
    sender = make_sender(app)
    for n in range(3):
        assert deliver(app.test_client(), sender, f"evt_b{n}", "demo.credit",
                       {"amount": 2}).status_code == 202
    result = runner.invoke(args=["ledger", "worker", "--burst", "--concurrency", "2"])
    assert result.exit_code == 0, result.output
    assert _state(app, sender, "evt_b2")[3] == 6
    assert all(_state(app, sender, f"evt_b{n}")[0].state.value == "complete" for n in range(3))


def test_run_worker_stops_when_told(app):
    sender = make_sender(app)
    stop = threading.Event()
    counted: list[int] = []
    thread = threading.Thread(
        target=lambda: counted.append(run_worker(app.extensions["ledger"], stop=stop,
                                                 concurrency=2, worker_id="loop")))
    thread.start()
    try:
        assert deliver(app.test_client(), sender, "evt_loop", "demo.credit",
                       {"amount": 4}).status_code == 202
        deadline = time.monotonic() + WAIT
        while _state(app, sender, "evt_loop")[0].state.value != "complete":
            assert time.monotonic() < deadline, "the running worker never completed the job"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert counted == [1]


@pytest.mark.slow
def test_sigterm_finishes_the_current_job_then_exits(app, test_env):
    sender = make_sender(app)
    assert deliver(app.test_client(), sender, "evt_slow", "demo.slow",
                   {"amount": 3, "seconds": 2}).status_code == 202
    process = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "ledger"), "worker"],
        env={**os.environ, **test_env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + WAIT
        while not _state(app, sender, "evt_slow")[1]:  # the attempt row: it is sleeping
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)
    receipt, _history, job, credited = _state(app, sender, "evt_slow")
    assert (receipt.state.value, receipt.result_ref, credited, job) == (
        "complete", "credit:3", 3, None)


def test_no_lock_is_held_while_a_handler_prepares(fixed_app):
    """The slow step runs with no transaction: the job row can be locked by anyone meanwhile."""
    app = fixed_app
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    send(app, sender, "evt_prep", "demo.slow", {"amount": 2, "seconds": 0}, expect=202)
    preparing, go = threading.Event(), threading.Event()

    def slow_step(event) -> None:
        preparing.set()
        assert go.wait(WAIT)

    registry = Registry({"demo.slow": HandlerSpec(event_type="demo.slow", apply=credit,
                                                  prepare=slow_step)})
    thread = threading.Thread(target=Worker(svc, handlers=registry).process_one)
    thread.start()
    try:
        assert preparing.wait(WAIT)
        with svc.engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE takes the write lock
            locked = conn.execute(select(jobs.c.event_id).where(jobs.c.event_id == "evt_prep")
                                  .with_for_update(nowait=True)).scalar()  # PG: row lock now
        assert locked == "evt_prep"
    finally:
        go.set()
        thread.join(WAIT)
    assert _state(app, sender, "evt_prep")[3] == 2


def test_demo_slow_sleeps_in_its_prepare_step(fixed_app):
    from ledger.worker.handlers import load_registry

    registry = load_registry(fixed_app.extensions["ledger"].settings)
    assert registry.get("demo.slow").prepare is not None
    assert registry.get("demo.credit").prepare is None
    assert {"demo.credit", "demo.fail", "demo.flaky", "demo.slow"} <= set(registry.types())


class SimulatedCrash(BaseException):
    """Stands for the worker process dying inside a handler: nothing catches it."""


def _job_lease(app, event_id):
    """Return (leased_by, attempts) of a job, read on a connection of its own."""
    with app.extensions["ledger"].engine.connect() as conn:
        row = conn.execute(select(jobs.c.leased_by, jobs.c.attempts)
                           .where(jobs.c.event_id == event_id)).one()
        return row.leased_by, row.attempts


def _two_queued(app, first, second):  # type: ignore[no-untyped-def]
    """Queue two (event id, type, amount) deliveries a second apart; return (services, sender)."""
    svc = app.extensions["ledger"]
    sender = make_sender(app)
    send(app, sender, first[0], first[1], {"amount": first[2]}, expect=202)
    svc.clock.advance(1)
    send(app, sender, second[0], second[1], {"amount": second[2]}, expect=202)
    return svc, sender


def test_the_loop_claims_the_next_job_with_a_completion_and_counts_it_first(fixed_app):
    """In run(), job 1's commit leases job 2: a job that kills its worker still spends tries."""
    app = fixed_app
    svc, sender = _two_queued(app, ("evt_first", "demo.credit", 1),
                              ("evt_killer", "t.kill", 1))

    def kill(conn, event) -> str:
        raise SimulatedCrash()

    registry = Registry({"demo.credit": HandlerSpec(event_type="demo.credit", apply=credit),
                         "t.kill": HandlerSpec(event_type="t.kill", apply=kill)})
    with pytest.raises(SimulatedCrash):
        Worker(svc, worker_id="w-chain", handlers=registry, batch_size=1).run(
            stop=threading.Event())
    # The killer's transaction never committed, yet its lease and attempt are
    # there: they were committed before its handler ran, with evt_first.
    assert _job_lease(app, "evt_killer") == ("w-chain", 1)
    receipt, history, job, credited = _state(app, sender, "evt_killer")
    assert (receipt.state.value, receipt.attempts, job is not None) == ("pending", 1, True)
    assert history == [(1, "w-chain", None)]  # open: the next claim marks it lost
    assert _state(app, sender, "evt_first")[0].state.value == "complete" and credited == 1


def test_a_chained_claim_closes_the_attempt_a_vanished_worker_left_open(fixed_app, caplog):
    """A loop's completion claims a job whose last worker died: that attempt becomes lost
    (in the completion's transaction), is logged once, and the job then completes."""
    app = fixed_app
    svc, sender = _two_queued(app, ("evt_first", "demo.credit", 1),
                              ("evt_killer", "t.kill", 1))
    kills: list[str] = []

    def kill_once(conn, event) -> str:
        if not kills:
            kills.append(event.event_id)
            raise SimulatedCrash()
        return credit(conn, event)

    registry = Registry({"demo.credit": HandlerSpec(event_type="demo.credit", apply=credit),
                         "t.kill": HandlerSpec(event_type="t.kill", apply=kill_once)})
    with pytest.raises(SimulatedCrash):
        Worker(svc, worker_id="w-dead", handlers=registry, batch_size=1).run(stop=threading.Event())
    # due before the lease ends
    send(app, sender, "evt_third", "demo.credit", {"amount": 2}, expect=202)
    svc.clock.advance(61)
    stop = threading.Event()
    done: list[str] = []

    def stop_when_both_ran(event) -> None:
        done.append(event.event_id)
        if len(done) == 2:
            stop.set()

    worker = Worker(svc, worker_id="w-next", handlers=registry, batch_size=1,
                    hooks=WorkerHooks(after_commit=stop_when_both_ran))
    with caplog.at_level(logging.INFO, logger="ledger"):
        assert worker.run(stop=stop) == 2
    assert done == ["evt_third", "evt_killer"]  # the killer rode on evt_third's commit
    receipt, history, job, _ = _state(app, sender, "evt_killer")
    assert history == [(1, "w-dead", "lost"), (2, "w-next", "complete")]
    assert (receipt.state.value, receipt.attempts, job) == ("complete", 2, None)
    lost = [line for line in map(json.loads, (r.getMessage() for r in caplog.records))
            if line.get("to_state") == "lost"]
    assert [(line["attempt"], line["lost_attempts"]) for line in lost] == [(1, 1)]


def test_a_loop_told_to_stop_claims_nothing_more(fixed_app):
    """Stop during a job: that job completes, the next one stays unleased for anyone."""
    app = fixed_app
    svc, sender = _two_queued(app, ("evt_one", "demo.credit", 2), ("evt_two", "demo.credit", 3))
    stop = threading.Event()

    def credit_then_stop(conn, event) -> str:
        stop.set()  # SIGTERM arrives while this job runs
        return credit(conn, event)

    registry = Registry({"demo.credit": HandlerSpec(event_type="demo.credit",
                                                    apply=credit_then_stop)})
    assert Worker(svc, worker_id="w-stop", handlers=registry, batch_size=1).run(stop=stop) == 1
    assert _state(app, sender, "evt_one")[0].state.value == "complete"
    assert _job_lease(app, "evt_two") == (None, 0)
    assert Worker(svc, worker_id="w-next").process_one()  # due now, no lease to wait out
    assert _state(app, sender, "evt_two")[0].result_ref == "credit:5"
