"""Every ledger statement of the intake is keyed by the consumer scope (README "Scaling past
one database"): the ledger can then be distributed by scope_id (Citus) or split by scope
across databases. This test keeps that plan true as the code changes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event

from ledger.intake.store import DriverClaim
from ledger.worker.loop import process_one
from ledger.worker.sql import DRIVER_COMPLETE
from tests.helpers import deliver, event_body, make_sender, signed_headers

LEDGER_TABLES = ("receipts", "jobs", "conflicts", "unsigned_bodies", "attempts",
                 "demo_balances")
TABLE = re.compile(r"\b(?:from|into|update|join)\s+(" + "|".join(LEDGER_TABLES) + r")\b")
TABLE_REFERENCE = re.compile(r"\b(from|into|update|join)\s+(" + "|".join(LEDGER_TABLES) + r")\b")
INSERT_COLUMNS = re.compile(r"\binsert into (\w+) \(([^)]*)\)")
CLAIM_ORDER = re.compile(r"\border by (?:jobs\.)?run_at\b")
# scope_id compared with a bound parameter (psycopg %(name)s, SQLite ?), not a column.
SCOPE_EQUALS_PARAM = re.compile(r"\bscope_id\s*=\s*(?:%\(\w+\)s|\?|:\w+)")


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


def test_every_intake_statement_is_keyed_by_scope(app, client):
    """Accepted, duplicate, conflicting and replayed-body deliveries touch one scope only."""
    stripe = make_sender(app)
    github = make_sender(app, name="gh", profile="github")
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
    # The signed-id claim runs on the driver connection, unseen by engine events.
    driver = [" ".join(s.split()).lower() for s in DriverClaim(engine).statements]
    touched = ledger_statements(statements) + driver
    tables = {TABLE.search(s).group(1) for s in touched}
    assert {"receipts", "jobs", "conflicts", "unsigned_bodies"} <= tables
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
        touched.append(" ".join(DRIVER_COMPLETE.sql(svc.engine.dialect).split()).lower())
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
