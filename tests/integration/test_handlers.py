"""The public handler API on both databases, on the single-job and the batched worker paths.

The fence (a handler cannot commit, roll back, begin or close its transaction, reach the
driver's connection or send transaction-control SQL), the one path (process_one, a batch
of one and a batch of several leave the same receipts and attempts),
PermanentFailure and RetryAfter, registration from what the configured modules
import and from entry points, and the hand-off of a type another live worker handles.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from app import create_app
from ledger.clock import FixedClock
from ledger.db.schema import attempts, failure_members, jobs, receipts
from ledger.demo.handlers import credit
from ledger.demo.seed import balance
from ledger.handlers import Event, FenceViolation, PermanentFailure, RetryAfter
from ledger.reads.receipts import get_receipt, receipt_detail
from ledger.scheduling.instances import InstanceKind, beat, live_instances, registered
from ledger.worker import handlers as registry_module
from ledger.worker.handlers import Registry, load_registry
from ledger.worker.loop import Worker
from tests.dashboard_helpers import fast_hashes, logged_in  # noqa: F401  (autouse fixture)
from tests.helpers import make_sender, send

PATHS = pytest.mark.parametrize("batch_size", [1, 8], ids=["single", "batched"])


class FixedRandom:
    """An RNG that always answers the same fraction."""

    def random(self) -> float:
        """Return one half."""
        return 0.5


@pytest.fixture
def fixed_app(test_env):
    """The app with a FixedClock, a 60 s lease and 10 s retry base."""
    app = create_app({**test_env, "LEDGER_LEASE_SECONDS": "60",
                      "LEDGER_RETRY_BASE_SECONDS": "10", "LEDGER_MAX_ATTEMPTS": "3"},
                     clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


def _run(app, handlers, batch_size):
    """Run one burst of a worker with `handlers`; return the jobs it processed."""
    worker = Worker(app.extensions["ledger"], worker_id="w-test", batch_size=batch_size,
                    handlers=Registry.of(handlers), rng=FixedRandom())
    return worker.run(burst=True)


def _state(app, sender, event_id):
    """Return (state, result_ref, last_error, attempts history, job row)."""
    with app.extensions["ledger"].engine.connect() as conn:
        detail = receipt_detail(conn, sender.scope_id, event_id)
        history = [(r.number, r.outcome) for r in conn.execute(
            select(attempts).where(attempts.c.event_id == event_id)
            .order_by(attempts.c.number))]
        job = conn.execute(select(jobs).where(jobs.c.event_id == event_id)).first()
    return detail["state"], detail["result_ref"], detail["last_error"], history, job


def _balance(app, sender):
    with app.extensions["ledger"].engine.connect() as conn:
        return balance(conn, sender.scope_id)


def _escape(conn, method):
    """Try to end the handler's transaction the way `method` says."""
    if method == "caught":
        with contextlib.suppress(FenceViolation):  # swallowed: the attempt fails all the same
            conn.commit()
    elif method == "with":
        with conn:
            pass
    elif method == "get_transaction":
        conn.get_transaction().commit()
    elif method == "connection":  # the driver's connection beneath
        conn.connection.commit()
    elif method.startswith("sql:"):
        conn.exec_driver_sql(method.removeprefix("sql:"))
    elif method.startswith("text:"):
        conn.execute(text(method.removeprefix("text:")))
    else:
        getattr(conn, method)()


@PATHS
@pytest.mark.parametrize("method", [
    "commit", "rollback", "begin", "close", "with", "get_transaction", "caught", "connection",
    "sql:COMMIT", "text:COMMIT", "text:rollback", "sql:END", "sql:BEGIN", "text:ABORT",
    "text:SELECT 1; COMMIT", "sql:/* note */ commit", "sql:SAVEPOINT mine",
    "text:RELEASE SAVEPOINT ledger_job"])
def test_a_handler_cannot_commit_past_the_fence(fixed_app, batch_size, method):
    app, clock = fixed_app, fixed_app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_esc", "t.escape", {"amount": 5}, expect=202)
    send(app, sender, "evt_ok", "demo.credit", {"amount": 1}, expect=202)

    def escape(conn, event):
        credit(conn, event)  # written, then the handler tries to commit it on its own
        _escape(conn, method)
        return "escaped"

    assert _run(app, {"t.escape": escape, "demo.credit": credit}, batch_size) == 2
    state, _, last_error, history, job = _state(app, sender, "evt_esc")
    assert (state, history) == ("pending", [(1, "retry")])
    assert last_error.startswith("FenceViolation: a handler may not ")
    assert job.run_at > clock.now()  # retried later, like any failure
    assert _balance(app, sender) == 1  # only evt_ok's credit: nothing of the handler's
    clock.advance(60)
    assert _run(app, {"t.escape": credit}, batch_size) == 1
    assert _state(app, sender, "evt_esc")[:2] == ("complete", "credit:6")


@PATHS
def test_sql_that_only_mentions_a_transaction_word_runs(fixed_app, batch_size):
    app = fixed_app
    sender = make_sender(app)
    send(app, sender, "evt_words", "t.words", {"amount": 2}, expect=202)

    def words(conn, event):
        said = conn.execute(text("SELECT 'COMMIT; END' -- ROLLBACK")).scalar()
        credit(conn, event)
        return f"said:{said}"

    assert _run(app, {"t.words": words}, batch_size) == 1
    assert _state(app, sender, "evt_words")[:2] == ("complete", "said:COMMIT; END")
    assert _balance(app, sender) == 2


def test_savepoints_inside_the_handler_stay_allowed(fixed_app):
    app = fixed_app
    sender = make_sender(app)
    send(app, sender, "evt_sp", "t.nested", {"amount": 4}, expect=202)

    def nested(conn, event):
        with conn.begin_nested():
            credit(conn, event)
        return f"nested:{conn.dialect.name}"

    assert _run(app, {"t.nested": nested}, 1) == 1
    assert _state(app, sender, "evt_sp")[0] == "complete"
    assert _balance(app, sender) == 4


@PATHS
def test_permanent_failure_fails_at_once_and_requeues_like_any_failure(fixed_app, batch_size):
    app = fixed_app
    sender = make_sender(app)
    send(app, sender, "evt_perm", "t.perm", {"amount": 3}, expect=202)

    def refuse(conn, event):
        credit(conn, event)
        raise PermanentFailure("invoice 7 does not exist")

    assert _run(app, {"t.perm": refuse}, batch_size) == 1
    state, _, last_error, history, job = _state(app, sender, "evt_perm")
    assert (state, last_error, history) == ("failed", "invoice 7 does not exist", [(1, "failed")])
    assert job.payload is not None and _balance(app, sender) == 0  # kept for review
    with app.extensions["ledger"].engine.connect() as conn:
        assert conn.execute(select(failure_members.c.event_id)).scalars().all() == ["evt_perm"]
    result = app.test_cli_runner().invoke(args=[
        "ledger", "receipt", "requeue", "--scope", sender.scope, "--event-id", "evt_perm",
        "--reason", "invoice 7 created"])
    assert result.exit_code == 0, result.output
    assert _run(app, {"t.perm": credit}, batch_size) == 1
    assert _state(app, sender, "evt_perm")[:2] == ("complete", "credit:3")


@PATHS
def test_retry_after_sets_the_next_attempt_and_stays_bounded(fixed_app, batch_size):
    app, clock = fixed_app, fixed_app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_later", "t.later", {"amount": 2}, expect=202)
    send(app, sender, "evt_never", "t.never", {"amount": 2}, expect=202)

    def later(conn, event):
        raise RetryAfter(120, "rate limited")

    def never(conn, event):
        raise RetryAfter(10**9)  # past the event's age: ends it now

    handlers = {"t.later": later, "t.never": never}
    assert _run(app, handlers, batch_size) == 2
    state, _, last_error, history, job = _state(app, sender, "evt_later")
    assert (state, history, last_error) == ("pending", [(1, "retry")], "RetryAfter: rate limited")
    assert job.run_at == clock.now() + timedelta(seconds=120)
    assert _state(app, sender, "evt_never")[0] == "failed"
    clock.advance(119)
    assert _run(app, handlers, batch_size) == 0  # not sooner than asked
    for attempt in (2, 3):
        clock.advance(1 if attempt == 2 else 120)
        assert _run(app, handlers, batch_size) == 1
    state, _, _, history, _ = _state(app, sender, "evt_later")
    assert (state, history) == ("failed", [(1, "retry"), (2, "retry"), (3, "failed")])


def test_retry_after_and_permanent_failure_refuse_nonsense():
    for seconds in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError):
            RetryAfter(seconds)  # type: ignore[arg-type]
    assert (RetryAfter(2.5).seconds, PermanentFailure("no").reason) == (2.5, "no")


# --- registration -------------------------------------------------------------

LIB = '''
from ledger.handlers import Event, handler

@handler("{type}")
def mark_paid(conn, event: Event) -> str:
    return "paid:" + event.idempotency_key
'''


def _module(tmp_path, monkeypatch, source):
    """Write a module with a unique name on sys.path; return its name."""
    name = f"acme_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_handlers_declared_by_what_a_configured_module_imports_are_registered(
        fixed_app, tmp_path, monkeypatch):
    settings = fixed_app.extensions["ledger"].settings
    lib = _module(tmp_path, monkeypatch, LIB.format(type="invoice.paid"))
    app_module = _module(tmp_path, monkeypatch, f"import {lib}  # noqa\n")
    registry = load_registry(settings.with_(handler_modules=(app_module,)))
    assert "invoice.paid" in registry.types()
    # Declared before the configured module was imported (a test or a tool imported it).
    early = _module(tmp_path, monkeypatch, LIB.format(type="invoice.voided"))
    __import__(early)
    late = _module(tmp_path, monkeypatch, f"from {early} import mark_paid  # noqa\n")
    assert "invoice.voided" in load_registry(
        settings.with_(handler_modules=(late,))).types()


def test_a_delivery_reaches_a_handler_its_module_imports(fixed_app, tmp_path, monkeypatch):
    lib = _module(tmp_path, monkeypatch, LIB.format(type="invoice.paid"))
    app_module = _module(tmp_path, monkeypatch, f"import {lib}  # noqa\n")
    svc = fixed_app.extensions["ledger"]
    sender = make_sender(fixed_app)
    send(fixed_app, sender, "evt_lib", "invoice.paid", expect=202)
    worker = Worker(svc, worker_id="w", handlers=load_registry(
        svc.settings.with_(handler_modules=(app_module,))))
    assert worker.run(burst=True) == 1
    assert _state(fixed_app, sender, "evt_lib")[1] == f"paid:{sender.scope}:evt_lib"


def _invoke(test_env, command, **env):
    """Run `ledger <command>` with extra settings; return the click result."""
    app = create_app({**test_env, **env})
    try:
        return app.test_cli_runner().invoke(args=["ledger", *command])
    finally:
        app.extensions["ledger"].close()


@pytest.mark.parametrize("command", [["worker", "--burst"], ["dev", "--port", "1"]])
def test_a_bad_handler_source_stops_worker_and_dev_at_start(test_env, tmp_path, monkeypatch,
                                                            command):
    empty = _module(tmp_path, monkeypatch, "VALUE = 1\n")
    first = _module(tmp_path, monkeypatch, LIB.format(type="dup.type"))
    second = _module(tmp_path, monkeypatch, LIB.format(type="dup.type"))
    broken = _module(tmp_path, monkeypatch, "raise RuntimeError('no config')\n")
    for modules, named in ((empty, empty), (f"{first},{second}", "dup.type"),
                           (broken, broken), ("no_such_module_anywhere", "no_such_module")):
        result = _invoke(test_env, command, LEDGER_HANDLER_MODULES=modules)
        assert result.exit_code == 2, result.output
        assert named in result.output and "Traceback" not in result.output


def test_entry_points_register_their_handlers(test_env, fixed_app, tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch, LIB.format(type="ep.type"))
    dist = tmp_path / "acme_ep-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-ep\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[replay_ledger.handlers]\nacme = {module}\n")
    registry_module._entry_point_modules.cache_clear()
    try:
        assert "ep.type" in load_registry(fixed_app.extensions["ledger"].settings).types()
        (dist / "entry_points.txt").write_text("[replay_ledger.handlers]\nacme = acme_gone\n")
        registry_module._entry_point_modules.cache_clear()
        result = _invoke(test_env, ["worker", "--burst"])
        assert result.exit_code == 2 and "entry point 'acme'" in result.output, result.output
    finally:
        sys.path.remove(str(tmp_path))
        registry_module._entry_point_modules.cache_clear()


# --- rolling deploys ----------------------------------------------------------

@PATHS
def test_a_type_a_live_worker_handles_is_left_to_it(fixed_app, batch_size):
    app = fixed_app
    svc, clock = app.extensions["ledger"], app.extensions["ledger"].clock
    sender = make_sender(app)
    send(app, sender, "evt_new", "t.new", {"amount": 1}, expect=202)
    send(app, sender, "evt_old", "demo.credit", {"amount": 2}, expect=202)
    with svc.engine.begin() as conn:  # a newer worker, alive, with the handler of t.new
        beat(conn, "host-b:7:newer", kind=InstanceKind.WORKER, now=clock.now(),
             refreshed_at=None, handles=("demo.credit", "t.new"))
    assert _run(app, {"demo.credit": credit}, batch_size) == 2  # and --burst ends
    state, _, _, history, job = _state(app, sender, "evt_new")
    assert (state, history, job.attempts) == ("pending", [(1, "handed-off")], 0)
    assert _state(app, sender, "evt_old")[0] == "complete"  # the rest of its work was done
    assert _run(app, {"demo.credit": credit}, batch_size) == 0  # no spinning on it
    # The newer worker stops beating: once it is dead, the old one may ignore the type.
    clock.advance(svc.settings.revocation_bound_seconds + 1)
    assert _run(app, {"demo.credit": credit}, batch_size) == 1
    assert _state(app, sender, "evt_new")[:2] == ("complete", "ignored:no-handler")


def test_worker_instances_publish_and_show_the_types_they_handle(app):
    svc = app.extensions["ledger"]
    with registered(svc.engine, svc.clock, InstanceKind.WORKER, interval=60,
                    handles=("invoice.paid", "demo.credit")):
        with svc.engine.connect() as conn:
            (me,) = live_instances(conn, now=svc.clock.now(), within_seconds=60,
                                   kind=InstanceKind.WORKER)
        assert me.handles == ("demo.credit", "invoice.paid")
        page = logged_in(app, "viewer").get("/").get_data(as_text=True)
        assert "handles: demo.credit, invoice.paid" in page


def test_the_event_a_handler_gets_is_typed_and_complete(fixed_app):
    app = fixed_app
    sender = make_sender(app)
    send(app, sender, "evt_typed", "t.typed", {"amount": 9}, expect=202)
    seen: list[Event] = []

    def remember(conn, event):
        seen.append(event)
        return "ok"

    assert _run(app, {"t.typed": remember}, 1) == 1
    (event,) = seen
    assert (event.scope, event.event_id, event.event_type, event.attempt) == (
        sender.scope, "evt_typed", "t.typed", 1)
    assert event.idempotency_key == f"{sender.scope}:evt_typed"
    assert event.payload["data"] == {"amount": 9}
    assert "amount" not in repr(event)  # the payload never reaches a log line
    with app.extensions["ledger"].engine.connect() as conn:
        assert get_receipt(conn, sender.scope, "evt_typed").result_ref == "ok"
    assert json.dumps(event.accepted_at.isoformat())


def test_worker_help_says_how_handlers_are_registered(runner):
    result = runner.invoke(args=["ledger", "worker", "--help"])
    assert result.exit_code == 0
    for term in ("LEDGER_HANDLER_MODULES", "replay_ledger.handlers", "exit 2",
                 "ignored:no-handler"):
        assert term in " ".join(result.output.split()), term


# --- one path -------------------------------------------------------------------

def _one_of_each(conn, event):
    """A handler per outcome, chosen by the event's data: the one-path comparison's."""
    kind = event.payload["data"]["kind"]
    credit(conn, event)  # written first: only a completion may keep it
    if kind == "fail":
        raise RuntimeError("downstream said no")
    if kind == "permanent":
        raise PermanentFailure("the account is closed")
    if kind == "later":
        raise RetryAfter(30)
    if kind == "escape":
        conn.exec_driver_sql("COMMIT")
    return f"{kind}:{event.attempt}"


def _rows_of(app, sender):
    """Return a scope's receipts, jobs and attempt rows, keyed by event id (no scope, no ids)."""
    with app.extensions["ledger"].engine.connect() as conn:
        found = {table.name: sorted(
            tuple(v for k, v in row._mapping.items()
                  if k not in ("scope_id", "id", "body_sha256", "lease_token", "leased_by",
                               "worker_id", "payload"))
            for row in conn.execute(select(table).where(table.c.scope_id == sender.scope_id)))
            for table in (receipts, jobs, attempts)}
    found["balance"] = [_balance(app, sender)]
    return found


def test_process_one_a_batch_of_one_and_a_batch_leave_the_same_rows(fixed_app):
    """The worker has one path: the same deliveries, run by process_one, by a loop of
    batches of one and by a batch of 8, end with the same receipts, jobs, attempt rows
    and effects (each outcome: complete, retry, RetryAfter, PermanentFailure, a fence
    violation, a hand-back to a live worker, no handler, out of attempts)."""
    app = fixed_app
    svc, clock = app.extensions["ledger"], app.extensions["ledger"].clock
    with svc.engine.begin() as conn:  # a live worker with the handler of t.elsewhere
        beat(conn, "host-b:7:newer", kind=InstanceKind.WORKER, now=clock.now(),
             refreshed_at=None, handles=("t.each", "t.elsewhere"))
    registry = Registry.of({"t.each": _one_of_each})
    kinds = ("ok", "fail", "permanent", "later", "escape", "ok")

    def deliveries(sender):
        for n, kind in enumerate(kinds):
            send(app, sender, f"evt_{n}", "t.each", {"amount": n + 1, "kind": kind}, expect=202)
        send(app, sender, "evt_away", "t.elsewhere", {"amount": 1}, expect=202)
        send(app, sender, "evt_none", "t.none", {"amount": 1}, expect=202)

    def by_process_one():
        worker = Worker(svc, worker_id="w-one", handlers=registry, rng=FixedRandom())
        while worker.process_one():
            pass

    def by_batches(size):
        return lambda: Worker(svc, worker_id=f"w-{size}", handlers=registry, rng=FixedRandom(),
                              batch_size=size).run(burst=True)

    rows = {}
    for name, drain in (("process_one", by_process_one), ("batch of one", by_batches(1)),
                        ("batch of 8", by_batches(8))):
        sender = make_sender(app, account=f"acct-{len(rows)}")
        deliveries(sender)
        for _ in range(4):  # every retry runs out of attempts (LEDGER_MAX_ATTEMPTS=3)
            drain()
            clock.advance(600)
        rows[name] = _rows_of(app, sender)
        clock.advance(-2400)  # the next path runs at the same times
    assert rows["process_one"] == rows["batch of one"] == rows["batch of 8"]
    with svc.engine.connect() as conn:  # and every outcome was met (the last path's rows)
        ends = {(e, detail["state"], detail["result_ref"]) for e in (
            "evt_0", "evt_2", "evt_none", "evt_away")
            if (detail := receipt_detail(conn, sender.scope_id, e))}
        outcomes = set(conn.execute(select(attempts.c.outcome).where(
            attempts.c.scope_id == sender.scope_id)).scalars())
    assert ends == {("evt_0", "complete", "ok:1"), ("evt_2", "failed", None),
                    ("evt_none", "complete", "ignored:no-handler"),
                    ("evt_away", "complete", "ignored:no-handler")}
    assert outcomes >= {"complete", "retry", "failed", "handed-off"}
    assert rows["process_one"]["balance"] == [1 + 6]  # evt_0 and evt_5 only
