"""Built-in demo handlers (CONTRACT.md section 3), loaded only when LEDGER_DEMO_HANDLERS=1.

They move a per-scope demo balance, which makes "exactly one business effect"
visible: `ledger demo balance --scope S`.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from ledger.db.schema import demo_balances
from ledger.handlers import Event, handler

MAX_SLOW_SECONDS = 3600


class DemoFailure(Exception):
    """Raised on purpose by demo.fail and demo.flaky."""


def _data(event: Event) -> dict[str, Any]:
    """Return the body's `data` object."""
    data = event.payload.get("data")
    if not isinstance(data, dict):
        raise ValueError(f"{event.event_type} needs a JSON object at data")
    return data


def _int_field(event: Event, name: str) -> int:
    """Return data.<name> as an integer, refusing anything else."""
    value = _data(event).get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{event.event_type} needs an integer data.{name}")
    return value


def _credit_statement(dialect: Any) -> Any:
    """Build the balance upsert once per dialect; each credit only binds values."""
    stmt = dialect.insert(demo_balances)
    return stmt.on_conflict_do_update(
        index_elements=["scope_id"],
        set_={"balance": demo_balances.c.balance + stmt.excluded.balance},
    ).returning(demo_balances.c.balance)


_CREDIT = {"postgresql": _credit_statement(postgresql), "sqlite": _credit_statement(sqlite)}


def add_to_balance(conn: Connection, scope_id: int, amount: int) -> int:
    """Add `amount` to the scope's demo balance and return the new balance."""
    stmt = _CREDIT["postgresql" if conn.dialect.name == "postgresql" else "sqlite"]
    return int(conn.execute(stmt, {"scope_id": scope_id, "balance": amount}).scalar_one())


@handler("demo.credit")
def credit(conn: Connection, event: Event) -> str:
    """Add data.amount to the scope's balance."""
    return f"credit:{add_to_balance(conn, event.scope_id, _int_field(event, 'amount'))}"


@handler("demo.fail")
def fail(conn: Connection, event: Event) -> str:
    """Always raise."""
    raise DemoFailure("demo.fail always fails")


@handler("demo.flaky")
def flaky(conn: Connection, event: Event) -> str:
    """Raise on the first data.fail_times attempts, then credit like demo.credit."""
    fail_times = _int_field(event, "fail_times")
    if event.attempt <= fail_times:
        raise DemoFailure(f"demo.flaky fails attempt {event.attempt} of {fail_times}")
    return credit(conn, event)


def _sleep(event: Event) -> None:
    """Sleep data.seconds with no transaction open (the worker calls this before it opens one)."""
    seconds = _data(event).get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError("demo.slow needs a non-negative number at data.seconds")
    time.sleep(min(float(seconds), MAX_SLOW_SECONDS))


@handler("demo.slow", prepare=_sleep)
def slow(conn: Connection, event: Event) -> str:
    """Credit like demo.credit once the out-of-transaction sleep is over."""
    return credit(conn, event)
