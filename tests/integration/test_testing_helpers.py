"""ledger.testing on both databases: what a handler package's own test suite relies on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import inspect, select, text

from ledger.db.schema import demo_balances
from ledger.demo.handlers import add_to_balance
from ledger.handlers import Event, FenceViolation, PermanentFailure, RetryAfter, handler
from ledger.testing import LedgerDatabase, ledger_database, run_handler

CALLS: list[str] = []


def _remote(event: Event) -> str:
    CALLS.append(event.idempotency_key)  # where a remote call would carry it
    return "remote-7"


@handler("testing.credit", prepare=_remote)
def credit(conn, event: Event) -> str:
    amount = event.payload.get("amount")
    if not isinstance(amount, int):
        raise PermanentFailure("amount must be an integer")
    balance = add_to_balance(conn, event.scope_id, amount)
    if balance > 100:
        raise RetryAfter(30, "over the daily limit")
    return f"{event.prepared}:{balance}:{event.attempt}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[LedgerDatabase]:
    """A database made by ledger_database() on each engine."""
    url = None
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_admin_url")
        if url is None:
            pytest.skip("PostgreSQL unavailable on this machine (never skipped in CI)")
    with ledger_database(url) as made:
        yield made
    if url is not None:  # the database is gone afterwards
        from sqlalchemy import create_engine

        admin = create_engine(url)
        with admin.connect() as conn:
            assert not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                    {"n": made.engine.url.database}).first()
        admin.dispose()


def _balance(database: LedgerDatabase, scope_id: int = 1) -> int | None:
    with database.engine.connect() as conn:
        return conn.execute(select(demo_balances.c.balance)
                            .where(demo_balances.c.scope_id == scope_id)).scalar()


def test_a_migrated_database_and_a_committed_run(database):
    assert "receipts" in inspect(database.engine).get_table_names()
    run = run_handler(database, credit, payload={"amount": 40}, scope="acme/shop", attempt=2)
    assert (run.completed, run.result_ref) == (True, "remote-7:40:2")
    assert CALLS[-1] == f"acme/shop:{run.event.event_id}"
    assert _balance(database) == 40  # committed: a test can query the effects
    by_type = run_handler(database, "testing.credit", payload={"amount": 2}, prepared="given")
    assert by_type.result_ref == "given:42:1"


def test_failures_come_back_and_roll_the_writes_back(database):
    refused = run_handler(database, credit, payload={"amount": "x"})
    assert refused.failure is not None and refused.result_ref is None
    assert refused.failure.reason == "amount must be an integer"
    later = run_handler(database, credit, payload={"amount": 150})
    assert later.retry is not None and later.retry.seconds == 30
    assert _balance(database) is None  # nothing of either run was committed


def test_the_fence_and_other_errors_are_raised(database):
    def escapes(conn, event):
        add_to_balance(conn, event.scope_id, 5)
        conn.commit()
        return "never"

    with pytest.raises(FenceViolation):
        run_handler(database, escapes, payload={})
    with pytest.raises(TypeError):
        run_handler(database, lambda conn, event: 7, payload={})  # type: ignore[arg-type,return-value]
    assert _balance(database) is None
    with pytest.raises(LookupError):
        run_handler(database, "testing.nobody", payload={})
