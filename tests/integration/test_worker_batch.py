"""The batched worker (LEDGER_WORKER_BATCH > 1) on SQLite and PostgreSQL.

Exactly-once effects with a failing handler in the batch, fencing, the attempt
history per job, database errors that spend no attempt, a slow handler that
cannot let its batch-mates be taken over, and kill -9 in the middle of a batch.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import exc as sa_exc
from sqlalchemy import select, text

from app import create_app
from ledger.clock import FixedClock, unix
from ledger.db.schema import attempts, jobs
from ledger.demo.handlers import credit
from ledger.demo.seed import balance
from ledger.domain import ReceiptState
from ledger.reads.receipts import get_receipt
from ledger.worker import batch
from ledger.worker.handlers import HandlerSpec, Registry
from ledger.worker.loop import Worker, WorkerHooks
from tests.helpers import WAIT, deliver, make_sender, send
from tests.integration.test_scope_keyed import captured_sql

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fixed_app(test_env):
    """The app with a FixedClock, a 60 s lease and a batch of 8."""
    app = create_app({**test_env, "LEDGER_LEASE_SECONDS": "60", "LEDGER_WORKER_BATCH": "8"},
                     clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


def _history(app, event_id):
    """Return the receipt's state and its attempts as (number, worker, outcome)."""
    with app.extensions["ledger"].engine.connect() as conn:
        rows = conn.execute(select(attempts).where(attempts.c.event_id == event_id)
                            .order_by(attempts.c.number)).all()
        job = conn.execute(select(jobs.c.event_id).where(jobs.c.event_id == event_id)).first()
        state = conn.execute(text("SELECT state FROM receipts WHERE event_id = :e"),
                             {"e": event_id}).scalar()
    history = [(r.number, r.worker_id, r.outcome) for r in rows]
    return ReceiptState.from_code(state).value, history, job is not None


def _balance(app, sender):
    with app.extensions["ledger"].engine.connect() as conn:
        return balance(conn, sender.scope_id)


class Handlers:
    """demo.credit, plus `t.fail` (credits, then raises) and `t.dberror` (a lock timeout)."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.failing = True

    def credit(self, conn, event) -> str:
        self.runs.append(event.event_id)
        return credit(conn, event)

    def fail(self, conn, event) -> str:
        self.runs.append(event.event_id)
        result = credit(conn, event)  # written, then undone with its savepoint
        if self.failing:
            raise ValueError("the remote said no")
        return result

    def dberror(self, conn, event) -> str:
        self.runs.append(event.event_id)
        result = credit(conn, event)
        if self.failing:
            raise sa_exc.OperationalError("UPDATE demo_balances", {}, Exception("lock timeout"))
        return result

    def registry(self) -> Registry:
        return Registry({t: HandlerSpec(event_type=t, apply=f) for t, f in (
            ("demo.credit", self.credit), ("t.fail", self.fail), ("t.dberror", self.dberror))})


def test_one_failing_handler_undoes_only_its_own_job(fixed_app):
    app, handlers = fixed_app, Handlers()
    svc, sender = app.extensions["ledger"], make_sender(app)
    for event_id, event_type, amount in (("evt_a", "demo.credit", 1), ("evt_b", "t.fail", 100),
                                         ("evt_c", "demo.credit", 2), ("evt_d", "demo.credit", 4)):
        send(app, sender, event_id, event_type, {"amount": amount}, expect=202)
    seen: list[str] = []
    hooks = WorkerHooks(before_commit=lambda _c, e: seen.append(f"run:{e.event_id}"),
                        after_commit=lambda e: seen.append(f"committed:{e.event_id}"))
    worker = Worker(svc, worker_id="w-batch", handlers=handlers.registry(), hooks=hooks)
    assert worker.batch_size == 8
    assert worker.run(burst=True) == 4
    # One transaction: every successful handler ran before any commit was reported.
    assert seen == ["run:evt_a", "run:evt_c", "run:evt_d",
                    "committed:evt_a", "committed:evt_c", "committed:evt_d"]
    assert _balance(app, sender) == 7  # evt_b's credit was rolled back with its savepoint
    for event_id in ("evt_a", "evt_c", "evt_d"):
        assert _history(app, event_id) == ("complete", [(1, "w-batch", "complete")], False)
    assert _history(app, "evt_b") == ("pending", [(1, "w-batch", "retry")], True)
    with svc.engine.connect() as conn:
        receipt = get_receipt(conn, sender.scope, "evt_b")
    assert receipt.last_error == "ValueError: the remote said no"
    # Its retry, once the backoff has passed, credits it exactly once.
    handlers.failing = False
    svc.clock.advance(3600)
    assert Worker(svc, worker_id="w-retry", handlers=handlers.registry()).run(burst=True) == 1
    assert _balance(app, sender) == 107
    assert _history(app, "evt_b") == ("complete", [(1, "w-batch", "retry"),
                                                   (2, "w-retry", "complete")], False)


def test_a_failed_statement_in_one_handler_undoes_only_its_own_job(fixed_app):
    """A handler whose SQL statement fails (on PostgreSQL the whole transaction is aborted
    until ROLLBACK TO its savepoint): its credit is undone, its batch-mates commit."""
    app, handlers = fixed_app, Handlers()
    svc, sender = app.extensions["ledger"], make_sender(app)

    def bad_statement(conn, event) -> str:
        credit(conn, event)  # written, then undone with its savepoint
        conn.execute(text("INSERT INTO demo_balances (scope_id, balance) VALUES (:s, 0)"),
                     {"s": event.scope_id})  # the row exists now: a unique violation
        return "unreachable"

    registry = Registry({"demo.credit": HandlerSpec(event_type="demo.credit",
                                                    apply=handlers.credit),
                         "t.badsql": HandlerSpec(event_type="t.badsql", apply=bad_statement)})
    for event_id, event_type, amount in (("evt_a", "demo.credit", 1), ("evt_b", "t.badsql", 100),
                                         ("evt_c", "demo.credit", 2)):
        send(app, sender, event_id, event_type, {"amount": amount}, expect=202)
    assert Worker(svc, worker_id="w-sql", handlers=registry).run(burst=True) == 3
    assert _balance(app, sender) == 3
    for event_id in ("evt_a", "evt_c"):
        assert _history(app, event_id) == ("complete", [(1, "w-sql", "complete")], False)
    assert _history(app, "evt_b") == ("pending", [(1, "w-sql", "retry")], True)


def test_result_refs_of_any_characters_complete_as_returned(fixed_app):
    """The batch completion carries each job's result_ref as written by its handler:
    quotes, backslashes, commas, braces, spaces and non-ASCII included."""
    app = fixed_app
    svc, sender = app.extensions["ledger"], make_sender(app)
    refs = {"evt_q": 'say "hi"', "evt_b": "back\\slash\\", "evt_c": "a,b}{c", "evt_n": "NULL",
            "evt_s": " spaced ", "evt_u": "crédit ☃"}
    registry = Registry({"demo.ref": HandlerSpec(
        event_type="demo.ref", apply=lambda conn, event: refs[event.event_id])})
    for event_id in refs:
        send(app, sender, event_id, "demo.ref", expect=202)
    assert Worker(svc, worker_id="w-refs", handlers=registry).run(burst=True) == len(refs)
    with svc.engine.connect() as conn:
        for event_id, ref in refs.items():
            receipt = get_receipt(conn, sender.scope, event_id)
            assert (receipt.state.value, receipt.result_ref) == ("complete", ref)


def test_a_database_error_in_one_handler_spends_no_attempt(test_env):
    app = create_app({**test_env, "LEDGER_WORKER_BATCH": "4", "LEDGER_MAX_ATTEMPTS": "1"},
                     clock=FixedClock(datetime.now(UTC)))
    try:
        handlers = Handlers()
        svc, sender = app.extensions["ledger"], make_sender(app)
        send(app, sender, "evt_ok", "demo.credit", {"amount": 1}, expect=202)
        send(app, sender, "evt_db", "t.dberror", {"amount": 10}, expect=202)
        worker = Worker(svc, worker_id="w-1", handlers=handlers.registry())
        assert worker.run(burst=True) == 2
        assert _balance(app, sender) == 1
        assert _history(app, "evt_db") == ("pending", [(1, "w-1", "interrupted")], True)
        # With LEDGER_MAX_ATTEMPTS=1 a spent attempt would make it fail: it runs again.
        handlers.failing = False
        svc.clock.advance(3600)
        assert Worker(svc, worker_id="w-2", handlers=handlers.registry()).run(burst=True) == 1
        assert _balance(app, sender) == 11
        assert _history(app, "evt_db") == ("complete", [(1, "w-1", "interrupted"),
                                                        (2, "w-2", "complete")], False)
    finally:
        app.extensions["ledger"].close()


def test_a_stale_batch_cannot_complete_a_job_another_worker_leased(fixed_app):
    app, handlers = fixed_app, Handlers()
    svc, sender = app.extensions["ledger"], make_sender(app)
    for i, amount in enumerate((1, 2, 4)):
        send(app, sender, f"evt_{i}", "demo.credit", {"amount": amount}, expect=202)
        svc.clock.advance(1)
    stale = Worker(svc, worker_id="w-stale", handlers=handlers.registry())
    stale.next_batch = batch.claim(stale)  # leased, then the worker stalls past its lease
    assert len(stale.next_batch) == 3
    svc.clock.advance(61)
    fresh = Worker(svc, worker_id="w-fresh", handlers=handlers.registry())
    fresh.next_batch = batch.claim(fresh)
    # An expired lease may have been a crash: that job comes alone.
    assert [lease.item.event_id for lease in fresh.next_batch] == ["evt_0"]
    assert batch.process_batch(stale) == 3
    assert "evt_0" not in handlers.runs  # fenced before its handler ran
    assert batch.process_batch(fresh) == 1
    assert _history(app, "evt_0") == ("complete", [(1, "w-stale", "lost"),
                                                   (2, "w-fresh", "complete")], False)
    for event_id in ("evt_1", "evt_2"):  # nobody took them: the stale tokens still held
        assert _history(app, event_id) == ("complete", [(1, "w-stale", "complete")], False)
    assert _balance(app, sender) == 7


def test_a_slow_handler_cannot_let_its_batch_mates_be_taken_over(test_env):
    """Leases of 1 s, a handler first in the batch that outlasts them: while the batch's
    transaction runs, another worker claims none of its jobs; each completes once, in one
    attempt."""
    app = create_app({**test_env, "LEDGER_LEASE_SECONDS": "1", "LEDGER_WORKER_BATCH": "3"})
    try:
        svc, sender = app.extensions["ledger"], make_sender(app)
        for i in range(3):
            send(app, sender, f"evt_{i}", "demo.credit", {"amount": 1}, expect=202)
        inside, claiming, tried = threading.Event(), threading.Event(), threading.Event()
        claimed: list[bool] = []
        # PostgreSQL lets the other claim run beside the open batch, so the batch waits for
        # its answer; SQLite queues every writer behind the batch's transaction, so there
        # the batch waits only until that claim is on its way.
        held_until = claiming if svc.engine.dialect.name == "sqlite" else tried

        def slow_first(conn, event) -> None:
            if not inside.is_set():
                inside.set()
                assert held_until.wait(WAIT), "the other worker never tried to claim"

        def other_worker() -> None:
            try:
                inside.wait(WAIT)
                time.sleep(1.2)  # real time: every 1 s lease of the batch has expired
                other = Worker(svc, worker_id="w-other", batch_size=3)
                claiming.set()
                claimed.append(other.process_one())
            finally:
                claiming.set()
                tried.set()

        thread = threading.Thread(target=other_worker)
        thread.start()
        worker = Worker(svc, worker_id="w-slow", hooks=WorkerHooks(before_commit=slow_first))
        assert worker.run(burst=True) == 3
        thread.join(WAIT)
        assert claimed == [False]
        for i in range(3):
            assert _history(app, f"evt_{i}") == ("complete", [(1, "w-slow", "complete")], False)
        assert _balance(app, sender) == 3
    finally:
        app.extensions["ledger"].close()


ACCOUNTS = itertools.count()


@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.booleans(), st.integers(1, 50)), min_size=1, max_size=12),
       size=st.integers(2, 5))
def test_every_job_of_any_batch_plan_has_exactly_one_effect(fixed_app, plan, size):
    """Any mix of failing and succeeding jobs, any batch size: each success credits once,
    each failure credits nothing and keeps retrying until LEDGER_MAX_ATTEMPTS (8)."""
    app, handlers = fixed_app, Handlers()
    svc, sender = app.extensions["ledger"], make_sender(app, account=f"h{next(ACCOUNTS)}")
    prefix = f"evt_{svc.clock.now().timestamp():.0f}_{size}_"
    for i, (fails, amount) in enumerate(plan):
        send(app, sender, f"{prefix}{i}", "t.fail" if fails else "demo.credit",
             {"amount": amount}, expect=202)
    for _ in range(8):  # every retry's backoff passes before the next round
        Worker(svc, worker_id="w-h", handlers=handlers.registry(), batch_size=size).run(
            burst=True)
        svc.clock.advance(4000)
    assert _balance(app, sender) == sum(amount for fails, amount in plan if not fails)
    for i, (fails, _) in enumerate(plan):
        state, history, job_left = _history(app, f"{prefix}{i}")
        if fails:
            assert (state, job_left) == ("failed", True)
            assert [o for *_, o in history] == ["retry"] * 7 + ["failed"]
        else:
            assert (state, history, job_left) == ("complete", [(1, "w-h", "complete")], False)
    assert handlers.runs.count(f"{prefix}0") == (8 if plan[0][0] else 1)


# --- kill -9 in the middle of a batch -------------------------------------------------

CHILD = r"""
import pathlib, sys, threading, time
from app import create_app
from ledger.worker.loop import WorkerHooks, run_worker

mode, marker = sys.argv[1], pathlib.Path(sys.argv[2])
svc = create_app().extensions["ledger"]
ran = []

def before_commit(conn, event):
    ran.append(event.event_id)
    if mode == "mid-batch" and len(ran) == 2:  # the second handler of the first batch
        marker.write_text(",".join(ran))
        time.sleep(120)

def after_commit(event):
    if mode == "after-batch-commit":
        marker.write_text("committed")
        time.sleep(120)

run_worker(svc, hooks=WorkerHooks(before_commit=before_commit, after_commit=after_commit),
           worker_id="child", stop=threading.Event())
"""


@pytest.fixture
def crash_app(test_env):
    env = {**test_env, "LEDGER_LEASE_SECONDS": "2", "LEDGER_WORKER_BATCH": "4",
           "LEDGER_LOG_LEVEL": "WARNING"}
    app = create_app(env)
    yield app, env
    app.extensions["ledger"].close()


AMOUNTS = (1, 2, 4, 8, 16, 32)  # a sum that shows which jobs credited, and how often


def _kill_child_at(env, cut: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with (tmp_path / "child.log").open("w") as log:
        child = subprocess.Popen([sys.executable, "-c", CHILD, cut, str(marker)], cwd=str(ROOT),
                                 env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                 stderr=log)
    try:
        deadline = time.monotonic() + WAIT
        while not marker.exists():
            assert child.poll() is None, (tmp_path / "child.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the child never reached its cut"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(WAIT)


def _recover(app) -> None:
    """Run a batched worker here until no job is left (past the dead worker's leases)."""
    svc = app.extensions["ledger"]
    deadline = time.monotonic() + WAIT
    while True:
        Worker(svc, worker_id="recovery").run(burst=True)
        with svc.engine.connect() as conn:
            if not conn.execute(select(jobs.c.event_id)).first():
                return
        assert time.monotonic() < deadline, "jobs left after the dead worker's leases"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["mid-batch", "after-batch-commit"])
def test_kill_9_in_a_batch_leaves_every_job_with_exactly_one_effect(crash_app, cut, tmp_path):
    app, env = crash_app
    sender = make_sender(app)
    for i, amount in enumerate(AMOUNTS):
        send(app, sender, f"evt_{i}", "demo.credit", {"amount": amount}, expect=202)
    _kill_child_at(env, cut, tmp_path)
    during = {f"evt_{i}": _history(app, f"evt_{i}") for i in range(len(AMOUNTS))}
    done = [e for e, (state, _, _) in during.items() if state == "complete"]
    if cut == "mid-batch":  # nothing of the batch committed; its 4 leases died with it
        assert done == [] and _balance(app, sender) == 0
    else:  # the first batch committed, and claimed the next one (2 jobs) with it
        assert len(done) == 4
        assert _balance(app, sender) == sum(AMOUNTS[int(e[4:])] for e in done)
    leased = [e for e, (_, history, _) in during.items() if e not in done and history]
    assert len(leased) == (4 if cut == "mid-batch" else 2)
    _recover(app)
    assert _balance(app, sender) == sum(AMOUNTS)  # every job credited exactly once
    for i in range(len(AMOUNTS)):
        state, history, job_left = _history(app, f"evt_{i}")
        outcomes = [outcome for *_, outcome in history]
        expected = ["lost", "complete"] if f"evt_{i}" in leased else ["complete"]
        assert (state, outcomes, job_left) == ("complete", expected, False)


def test_ledger_worker_takes_a_batch_size_from_1_to_64(app, runner):
    sender = make_sender(app)
    for n in range(5):
        assert deliver(app.test_client(), sender, f"evt_c{n}", "demo.credit",
                       {"amount": 2}).status_code == 202
    for refused in ("0", "65", "many"):
        assert runner.invoke(args=["ledger", "worker", "--burst", "--batch", refused]
                             ).exit_code == 2
    assert _balance(app, sender) == 0  # a refused command ran nothing
    result = runner.invoke(args=["ledger", "worker", "--burst", "--batch", "3"])
    assert result.exit_code == 0, result.output
    assert _balance(app, sender) == 10
    for n in range(5):
        assert _history(app, f"evt_c{n}")[0] == "complete"


def test_a_job_whose_handler_prepares_is_claimed_alone(test_env):
    """demo.slow sleeps in its prepare step, outside any transaction: its batch-mates never
    wait for it (nor their leases run down), so it comes in a batch of its own."""
    app = create_app({**test_env, "LEDGER_DEMO_HANDLERS": "1", "LEDGER_WORKER_BATCH": "8"},
                     clock=FixedClock(datetime.now(UTC)))
    try:
        svc, sender = app.extensions["ledger"], make_sender(app)
        for event_id, event_type in (("evt_1", "demo.credit"), ("evt_2", "demo.slow"),
                                     ("evt_3", "demo.credit")):
            now = unix(svc.clock.now())
            assert deliver(app.test_client(), sender, event_id, event_type,
                           {"amount": 1, "seconds": 0}, timestamp=now).status_code == 202
            svc.clock.advance(1)
        worker = Worker(svc, worker_id="w-alone")
        claims = []
        while leased := batch.claim(worker):
            claims.append(sorted(one.item.event_id for one in leased))
            worker.next_batch = leased
            batch.process_batch(worker)
        assert claims == [["evt_1", "evt_3"], ["evt_2"]]
        assert _balance(app, sender) == 3
        for event_id in ("evt_1", "evt_2", "evt_3"):
            assert _history(app, event_id) == ("complete", [(1, "w-alone", "complete")], False)
    finally:
        app.extensions["ledger"].close()


def test_a_batch_takes_the_oldest_jobs_scope_first_on_postgresql(test_env):
    """On PostgreSQL a batch is the oldest due job and its scope's next due jobs, then the
    oldest of other scopes to fill it: a batch holds the per-scope rows its handlers write
    (an account's balance) until it commits, so batches of few scopes keep workers from
    waiting on each other's rows. SQLite has one writer and claims plainly oldest first.
    The first batch is claimed on its own, the next ones by each completion."""
    app = create_app({**test_env, "LEDGER_WORKER_BATCH": "3"},
                     clock=FixedClock(datetime.now(UTC)))
    try:
        svc = app.extensions["ledger"]
        a, b = make_sender(app, account="acme"), make_sender(app, account="globex")
        order = ((a, "a1"), (b, "b1"), (a, "a2"), (b, "b2"), (a, "a3"), (b, "b3"), (b, "b4"))
        for sender, event_id in order:
            send(app, sender, event_id, expect=202)
            svc.clock.advance(1)
        worker = Worker(svc, worker_id="w-scope")
        worker._stop = threading.Event()  # not stopping: a completion claims the next batch
        claims, leased = [], batch.claim(worker)
        while leased:
            claims.append(sorted(one.item.event_id for one in leased))
            worker.next_batch = leased
            batch.process_batch(worker)
            leased, worker.next_batch = worker.next_batch, []
        if svc.engine.dialect.name == "postgresql":
            assert claims == [["a1", "a2", "a3"], ["b1", "b2", "b3"], ["b4"]]
        else:
            assert claims == [["a1", "a2", "b1"], ["a3", "b2", "b3"], ["b4"]]
        assert (_balance(app, a), _balance(app, b)) == (3, 4)
        for _, event_id in order:
            assert _history(app, event_id) == ("complete", [(1, "w-scope", "complete")], False)
    finally:
        app.extensions["ledger"].close()


def test_a_batch_names_the_scopes_of_its_jobs_in_one_statement(test_env):
    """A worker reads a scope's name once and keeps it; a batch's uncached scopes are read
    together, so a worker over many scopes does not pay a query per job."""
    app = create_app({**test_env, "LEDGER_WORKER_BATCH": "8"},
                     clock=FixedClock(datetime.now(UTC)))
    try:
        svc = app.extensions["ledger"]
        senders = [make_sender(app, account=f"acct{i}") for i in range(5)]
        for i, sender in enumerate(senders):
            send(app, sender, f"evt_{i}", expect=202)
            svc.clock.advance(1)
        worker = Worker(svc, worker_id="w-names")
        with captured_sql(svc.engine) as statements:
            leased = batch.claim(worker)
        assert sorted(lease.scope for lease in leased) == sorted(s.scope for s in senders)
        assert len([s for s in statements if " from integrations" in s]) == 1, statements
        worker.next_batch = leased
        batch.process_batch(worker)
        for i, sender in enumerate(senders):
            assert _balance(app, sender) == 1
            assert _history(app, f"evt_{i}") == ("complete", [(1, "w-names", "complete")], False)
    finally:
        app.extensions["ledger"].close()


def test_an_unset_batch_size_is_the_databases_and_a_set_one_wins(test_env):
    """Unset, a worker batches 16 jobs on PostgreSQL (where 16 completed 1.3-1.4x batch 8's
    jobs) and 8 on SQLite (where a batch holds the one writer against the intake);
    LEDGER_WORKER_BATCH, then --batch, override it on both."""
    expected = 16 if test_env["DATABASE_URL"].startswith("postgresql") else 8
    app = create_app(test_env)
    try:
        svc = app.extensions["ledger"]
        assert Worker(svc).batch_size == expected
        assert Worker(svc, batch_size=2).batch_size == 2
    finally:
        app.extensions["ledger"].close()
    app = create_app({**test_env, "LEDGER_WORKER_BATCH": "5"})
    try:
        assert Worker(app.extensions["ledger"]).batch_size == 5
    finally:
        app.extensions["ledger"].close()
