"""Test your own handlers: a migrated ledger database, and a handler run in a real transaction.

`ledger_database()` makes a database with the ledger's schema (a temporary
SQLite file, or a fresh database on the PostgreSQL server you name, dropped
afterwards); `run_handler()` runs a handler (and its prepare step) against an
`Event` in a transaction of that database, on the same fenced connection the
worker gives it, and commits its writes only when it returns a result_ref.
A pytest suite uses them like this::

    import pytest
    from sqlalchemy import text

    from ledger.testing import ledger_database, run_handler
    from acme_handlers.handlers import mark_paid

    @pytest.fixture(params=["sqlite", "postgresql://postgres@127.0.0.1/postgres"])
    def db(request):
        with ledger_database(None if request.param == "sqlite" else request.param) as database:
            yield database  # create your own tables here (your migrations, on database.url)

    def test_mark_paid(db):
        run = run_handler(db, mark_paid, payload={"data": {"invoice": "in_1", "amount": 5}})
        assert run.result_ref == "invoice:in_1"
        with db.engine.connect() as conn:  # the effects were committed
            assert conn.execute(text("SELECT amount FROM acme_invoices")).scalar() == 5

    def test_an_unknown_invoice_is_never_retried(db):
        run = run_handler(db, "acme.invoice.paid", payload={"data": {}})
        assert run.failure is not None and "invoice" in run.failure.reason
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from ledger.config import Settings
from ledger.db.engine import make_engine, upgrade
from ledger.handlers import Declaration, Event, Handler, PermanentFailure, RetryAfter, declarations
from ledger.worker.fence import run_fenced

__all__ = ["HandlerRun", "LedgerDatabase", "ledger_database", "run_handler"]

DEFAULT_SCOPE = "acme/test"
_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class LedgerDatabase:
    """A migrated ledger database: its URL and an engine on it."""

    url: str
    engine: Engine


@contextmanager
def ledger_database(url: str | None = None) -> Iterator[LedgerDatabase]:
    """Yield a migrated ledger database; gone when the block ends.

    Without `url`: a temporary SQLite file. With a PostgreSQL URL: a new database
    created on that server (the URL's own database is only used to create and
    drop it), so a test never touches data of its own.
    """
    if url is None:
        with tempfile.TemporaryDirectory(prefix="ledger-test-") as tmp:
            yield from _migrated(f"sqlite:///{Path(tmp) / 'ledger.sqlite3'}", Path(tmp))
        return
    if not url.startswith("postgresql"):
        raise ValueError("ledger_database() takes a PostgreSQL URL, or none for SQLite")
    name = f"ledger_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            with tempfile.TemporaryDirectory(prefix="ledger-test-") as tmp:
                yield from _migrated(make_url(url).set(database=name).render_as_string(
                    hide_password=False), Path(tmp))
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _migrated(url: str, var_dir: Path) -> Iterator[LedgerDatabase]:
    """Migrate the database at `url` and yield it with an engine (disposed afterwards)."""
    engine = make_engine(Settings(database_url=url, var_dir=var_dir))
    try:
        upgrade(engine)
        yield LedgerDatabase(url=url, engine=engine)
    finally:
        engine.dispose()


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerRun:
    """What one run of a handler came to: a result_ref (committed), or why not (rolled back)."""

    event: Event
    result_ref: str | None = None
    failure: PermanentFailure | None = None  # raised PermanentFailure: the receipt would fail
    retry: RetryAfter | None = None  # raised RetryAfter: the worker would wait retry.seconds

    @property
    def completed(self) -> bool:
        """Tell whether the handler returned (and its writes were committed)."""
        return self.result_ref is not None


def run_handler(database: LedgerDatabase | Engine, handler: Handler | str, *,
                payload: dict[str, Any] | None = None, event_type: str | None = None,
                scope: str = DEFAULT_SCOPE, scope_id: int = 1, event_id: str | None = None,
                attempt: int = 1, accepted_at: datetime | None = None,
                prepared: Any = _UNSET) -> HandlerRun:
    """Run a handler (by function or event type) and its prepare step as the worker does.

    The handler's writes commit when it returns; PermanentFailure and RetryAfter
    are returned in the result (its writes rolled back); any other exception is
    raised, as a retried failure would be. Pass `prepared` to skip the prepare step.
    """
    declared = _declaration(handler)
    event = Event(scope=scope, scope_id=scope_id,
                  event_id=event_id or f"evt_test_{uuid.uuid4().hex[:12]}",
                  event_type=event_type or declared.event_type, payload=payload or {},
                  attempt=attempt, accepted_at=accepted_at or datetime.now(UTC))
    engine = database.engine if isinstance(database, LedgerDatabase) else database
    try:
        if prepared is not _UNSET:
            event = replace(event, prepared=prepared)
        elif declared.prepare is not None:
            event = replace(event, prepared=declared.prepare(event))
        with engine.begin() as conn:
            result_ref = run_fenced(declared.apply, conn, event)
    except PermanentFailure as failure:
        return HandlerRun(event=event, failure=failure)
    except RetryAfter as retry:
        return HandlerRun(event=event, retry=retry)
    return HandlerRun(event=event, result_ref=result_ref)


def _declaration(handler: Handler | str) -> Declaration:
    """Return the declaration of a handler function or event type (a plain function too)."""
    if isinstance(handler, str):
        found = {d.apply: d for d in declarations() if d.event_type == handler}
        if len(found) != 1:
            raise LookupError(f"{len(found)} handlers are declared for {handler!r}; "
                              "import the module that declares it, or pass the function")
        return next(iter(found.values()))
    for declared in reversed(declarations()):
        if declared.apply is handler:
            return declared
    return Declaration(event_type="test.event", apply=handler)
