"""Every ledger statement of the intake is keyed by the consumer scope (README "Scaling past
one database"): the ledger can then be distributed by scope_id (Citus) or split by scope
across databases. This test keeps that plan true as the code changes.

Keyed means one scope: `scope_id = <one bound value>`. A filter on several scopes
(`scope_id = ANY(...)`, `scope_id IN (...)`) does not count: Citus refuses a locking
statement across shards and commits a write on several nodes in two phases. The
statements written for a distributed ledger (the intake's two-insert claim, the
worker's claim by key, the purge scope by scope) are checked here on PostgreSQL,
and on a real Citus cluster in test_citus.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from sqlalchemy import event

from jobs import retention_scoped
from jobs.retention_bookkeeping import expire_bookkeeping
from ledger.clock import FixedClock
from ledger.db import citus
from ledger.intake.store import DriverClaim
from ledger.worker.loop import Worker, process_one
from ledger.worker.sql import DRIVER_COMPLETE_ONE
from tests.dashboard_helpers import add_receipt
from tests.helpers import deliver, event_body, make_sender, signed_headers

LEDGER_TABLES = ("receipts", "jobs", "conflicts", "unsigned_bodies", "attempts",
                 "demo_balances", "sender_tokens")
TABLE = re.compile(r"\b(?:from|into|update|join)\s+(" + "|".join(LEDGER_TABLES) + r")\b")
TABLE_REFERENCE = re.compile(r"\b(from|into|update|join)\s+(" + "|".join(LEDGER_TABLES) + r")\b")
INSERT_COLUMNS = re.compile(r"\binsert into (\w+) \(([^)]*)\)")
CLAIM_ORDER = re.compile(r"\border by (?:jobs\.)?run_at\b")
# scope_id compared with one bound parameter (psycopg %(name)s or %s, SQLite ?), not a
# column, and not a list of scopes (`= ANY(...)` or `IN (...)` match nothing here).
SCOPE_EQUALS_PARAM = re.compile(r"\bscope_id\s*=\s*(?:%\(\w+\)s|%s|\?|:\w+)")


@contextmanager
def captured_sql(engine) -> Iterator[list[str]]:
    """Collect the SQL text of every statement the engine runs."""
    statements: list[str] = []

    def before(_conn, _cursor, statement, _params, _context, _many) -> None:
        statements.append(" ".join(statement.split()).lower())

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", before)


def keyed_by_scope(sql: str) -> bool:
    """Tell whether a statement names one scope in every part that touches a ledger table.

    Each INSERT into a ledger table (also inside a data-modifying CTE) must give it
    scope_id; each other reference (SELECT/UPDATE/DELETE) needs a WHERE clause
    comparing scope_id with a bound parameter.
    """
    references = TABLE_REFERENCE.findall(sql)
    inserts = [(t, cols) for t, cols in INSERT_COLUMNS.findall(sql) if t in LEDGER_TABLES]
    if sum(verb == "into" for verb, _ in references) != len(inserts):
        return False
    if not all("scope_id" in {c.strip() for c in cols.split(",")} for _, cols in inserts):
        return False
    others = sum(verb != "into" for verb, _ in references)
    keyed_wheres = sum(bool(SCOPE_EQUALS_PARAM.search(w)) for w in sql.split(" where ")[1:])
    return keyed_wheres >= others


def ledger_statements(statements: list[str]) -> list[str]:
    """Return the statements that touch a ledger table."""
    return [s for s in statements if TABLE.search(s)]


def test_the_checker_catches_an_unkeyed_statement():
    """The rule itself: a statement keyed only by event id does not pass."""
    assert not keyed_by_scope("select receipts.state from receipts "
                              "where receipts.event_id = %(event_id_1)s")
    assert not keyed_by_scope("delete from jobs where jobs.scope_id = receipts.scope_id")
    assert not keyed_by_scope("insert into conflicts (event_id, kind) values (?, ?)")
    assert keyed_by_scope("update jobs set run_at=? where jobs.scope_id = ? "
                          "and jobs.event_id = ?")
    assert keyed_by_scope("insert into receipts (accepted_at, scope_id) values (?, ?)")
    assert keyed_by_scope("with c as ( insert into receipts (scope_id, event_id) values (?, ?) "
                          "returning scope_id ) insert into jobs (scope_id, event_id) "
                          "select scope_id, event_id from c")
    assert not keyed_by_scope("select state from receipts where scope_id = ? union all "
                              "select status from jobs where event_id = ?")
    assert keyed_by_scope("with c as ( insert into receipts (scope_id) values (?) returning 1 )"
                          " select 1 from c union all select state from receipts r "
                          "where r.scope_id = %(scope_id)s and not exists (select 1 from c)")
    assert not keyed_by_scope("with c as ( insert into receipts (event_id) values (?) "
                              "returning event_id ) insert into jobs (scope_id, event_id) "
                              "select 1, event_id from c")
    # Several scopes at once is not one scope.
    assert not keyed_by_scope("select scope_id from jobs where jobs.scope_id = any(%(s)s) "
                              "for update skip locked")
    assert not keyed_by_scope("update jobs set run_at = ? where scope_id in (?, ?)")
    assert keyed_by_scope("select state from receipts where scope_id = %s and event_id = %s")


def test_every_intake_statement_is_keyed_by_scope(app, client):
    """Accepted, duplicate, conflicting and replayed-body deliveries touch one scope only."""
    stripe = make_sender(app)
    github = make_sender(app, name="gh", profile="github")
    mailgun = make_sender(app, name="mg", profile="mailgun")
    engine = app.extensions["ledger"].engine
    deliver(client, stripe, "evt_warm")  # the credential view is cached before capture
    deliver(client, github, "d-warm", "push.opened", {"warm": True})
    with captured_sql(engine) as statements:
        assert deliver(client, stripe, "evt_s1").status_code == 202
        assert deliver(client, stripe, "evt_s1").status_code == 202  # duplicate, pending
        assert deliver(client, stripe, "evt_s1", data={"amount": 99}).status_code == 409
        body = event_body("github", "d-1", "push.opened")
        assert client.post(f"/hooks/{github.public_id}", data=body, headers=signed_headers(
            github, body, "d-1", "push.opened")).status_code == 202
        replay = client.post(f"/hooks/{github.public_id}", data=body, headers=signed_headers(
            github, body, "d-2", "push.opened"))
        assert replay.status_code == 202 and replay.get_json()["event_id"] == "d-1"
        assert deliver(client, mailgun, "mg-1").status_code == 202  # its token is kept
    # The signed-id claim runs on the driver connection, unseen by engine events.
    driver = [" ".join(s.split()).lower() for s in DriverClaim(engine).statements]
    touched = ledger_statements(statements) + driver
    tables = {TABLE.search(s).group(1) for s in touched}
    assert {"receipts", "jobs", "conflicts", "unsigned_bodies", "sender_tokens"} <= tables
    unkeyed = [s for s in touched if not keyed_by_scope(s)]
    assert unkeyed == []


def test_worker_statements_are_keyed_by_scope_except_the_claim(app, client):
    """After the claim picks a job, every worker statement names that job's scope."""
    sender = make_sender(app)
    assert deliver(client, sender, "evt_w1").status_code == 202
    svc = app.extensions["ledger"]
    with captured_sql(svc.engine) as statements:
        assert process_one(svc, "scope-test")
    touched = ledger_statements(statements)
    if svc.engine.dialect.name == "postgresql":  # the completion runs on the driver connection
        assert not any("delete from jobs" in s for s in touched)
        # process_one completes one item: its completion names that item's scope.
        touched.append(" ".join(DRIVER_COMPLETE_ONE.sql(svc.engine.dialect).split()).lower())
    # SQLite: the SELECT … ORDER BY run_at; PostgreSQL: one statement that also leases.
    claim = [s for s in touched if CLAIM_ORDER.search(s)]
    assert len(claim) == 1, "the claim is the one cross-scope statement (README)"
    unkeyed = [s for s in touched if s not in claim and not keyed_by_scope(s)]
    assert unkeyed == []
    assert {"receipts", "jobs", "attempts", "demo_balances"} <= {
        table for s in touched for table in TABLE.findall(s)}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_statements_of_every_kind_are_seen(app, client):
    """A capture that saw nothing would pass vacuously: make sure the hook sees statements."""
    sender = make_sender(app, profile="github")  # unsigned ids: claimed through the engine
    with captured_sql(app.extensions["ledger"].engine) as statements:
        deliver(client, sender, "d-seen", "push.opened")
    assert any(s.startswith("insert into receipts") for s in statements)
    assert any(s.startswith("insert into jobs") for s in statements)


def test_driver_claim_lists_the_statements_it_runs(app):
    """The list the keyed-by-scope check reads is the SQL the claim runs, every part of it."""
    statements = " ".join(DriverClaim(app.extensions["ledger"].engine).statements).lower()
    for part in ("insert into receipts", "insert into jobs", "from receipts"):
        assert part in " ".join(statements.split())


def _scoped(statements: list[str]) -> tuple[list[str], list[str]]:
    """Split the ledger statements into (keyed by one scope, the rest)."""
    touched = ledger_statements(statements)
    return ([s for s in touched if keyed_by_scope(s)],
            [s for s in touched if not keyed_by_scope(s)])


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_distributed_statements_lock_and_write_one_scope_only(app, client):
    """The statements for a distributed ledger, run here on PostgreSQL: only unlocked
    reads span scopes (Citus runs those on every shard; it refuses a locking one)."""
    engine = app.extensions["ledger"].engine
    citus.use_scoped_statements(engine)
    senders = [make_sender(app, name=f"s{i}") for i in range(2)]
    claim = DriverClaim(engine)
    assert claim.distributed
    driver = [" ".join(s.split()).lower() for s in claim.statements]
    assert [keyed_by_scope(s) for s in driver] == [True, True, True]
    for sender in senders:
        assert deliver(client, sender, "evt_d1").status_code == 202
    svc = app.extensions["ledger"]
    with captured_sql(engine) as statements:
        worker = Worker(svc, worker_id="scoped")
        assert worker.process_one() and worker.process_one()
        assert not worker.process_one()
    keyed, spanning = _scoped(statements)
    assert any("for update" in s for s in keyed)  # the lock by key
    assert spanning and all(s.startswith("select") and "for update" not in s
                            for s in spanning), spanning
    assert {s.split(" from ")[1].split()[0] for s in spanning} == {"jobs"}


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_scope_by_scope_purge_writes_one_scope_per_statement(app):
    svc = app.extensions["ledger"]
    old = svc.clock.now() - timedelta(seconds=svc.settings.retention_seconds + 60)
    for scope in (1, 2):
        for i in range(3):
            add_receipt(app, scope, f"old-{i}", state=2 if i == 0 else 1, accepted_at=old)
    now = FixedClock(svc.clock.now() + timedelta(days=30))  # failed payloads past review too
    cutoff = now.now() - timedelta(seconds=svc.settings.retention_seconds)
    with captured_sql(svc.engine) as statements:
        dropped = retention_scoped.scoped_payloads(svc.engine, svc.settings, now.now(), 2)
        expired = retention_scoped.scoped_receipts(svc.engine, svc.settings, cutoff, 2)
        expire_bookkeeping(svc.engine, svc.settings, cutoff, scoped_conflicts=True)
    assert (dropped, expired) == (2, 6)
    keyed, spanning = _scoped(statements)
    assert any(s.startswith("with held") for s in keyed)
    assert any(s.startswith("update jobs set payload") for s in keyed)
    assert spanning and all(s.startswith("select distinct scope_id") for s in spanning), spanning
