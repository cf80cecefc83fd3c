"""The handler's connection: the completion transaction's, with its ends out of reach.

A handler that could commit would commit its effects apart from the receipt's
completion (and a retry would repeat them): exactly-once broken by one line of
user code. So the handler gets a proxy of the worker's connection that runs
statements as usual but refuses to commit, roll back, begin or close, to hand
out the driver's connection beneath it (`conn.connection`), and to run SQL that
ends or steps around the transaction (COMMIT, ROLLBACK, BEGIN, END, ABORT,
SAVEPOINT, RELEASE, PREPARE TRANSACTION..., by `execute(text(...))` or
`exec_driver_sql`); a refusal is remembered, so the attempt fails even if the
handler catches the error. Savepoints through `begin_nested()` stay inside the
transaction and are allowed.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn, cast

from sqlalchemy import Connection, TextClause

from ledger.handlers import Event, FenceViolation, Handler
from ledger.worker.handlers import NO_HANDLER_RESULT, HandlerSpec

# result_ref is a small reference kept on the hot receipts table for the whole retention.
RESULT_REF_LIMIT = 256
# Everything that ends, replaces or leaves the worker's transaction. Savepoints
# (begin_nested) stay inside it and are allowed.
_REFUSED = frozenset({"commit", "rollback", "begin", "close", "detach", "invalidate",
                      "get_transaction", "begin_twophase"})
# The driver's connection beneath: its commit() would end the transaction unseen.
_REFUSED_ATTRIBUTES = frozenset({"connection", "_dbapi_connection"})
# Statements that end, begin or step around the transaction (or its savepoints), as the
# first word of any statement of the SQL (psycopg runs several at once without
# parameters). Comments and string literals are skipped first.
_TRANSACTION_SQL = re.compile(
    r"^\s*(COMMIT|ROLLBACK|BEGIN|END|ABORT|START\s+TRANSACTION|SAVEPOINT|RELEASE"
    r"|PREPARE\s+TRANSACTION)\b", re.IGNORECASE)
_NOISE = re.compile(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$(\w*)\$.*?\$\1\$",
                    re.DOTALL)


def transaction_control(sql: str) -> str | None:
    """Return the transaction-control statement `sql` holds (its first word), if any."""
    for statement in _NOISE.sub(" ", sql).split(";"):
        match = _TRANSACTION_SQL.match(statement)
        if match is not None:
            return match.group(1).upper()
    return None


class FencedConnection:
    """Pass everything through to a Connection except what would end its transaction."""

    __slots__ = ("_conn", "violation")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.violation: FenceViolation | None = None

    def __getattr__(self, name: str) -> Any:
        if name in _REFUSED:
            return lambda *_args, **_kwargs: self._refuse(name)
        if name in _REFUSED_ATTRIBUTES:
            self._refuse(name, attribute=True)
        return getattr(self._conn, name)

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a statement, unless it is SQL that would end or leave the transaction."""
        if isinstance(statement, TextClause):
            self._check_sql(statement.text)
        return self._conn.execute(statement, *args, **kwargs)

    def exec_driver_sql(self, statement: str, *args: Any, **kwargs: Any) -> Any:
        """Run driver SQL, unless it would end or leave the transaction."""
        self._check_sql(statement)
        return self._conn.exec_driver_sql(statement, *args, **kwargs)

    def scalar(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a statement and return its first column of its first row (see execute)."""
        return self.execute(statement, *args, **kwargs).scalar()

    def scalars(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a statement and return its first column (see execute)."""
        return self.execute(statement, *args, **kwargs).scalars()

    def _check_sql(self, sql: str) -> None:
        """Refuse SQL that would end, begin or step around the worker's transaction."""
        command = transaction_control(sql)
        if command is not None:
            self._refuse(command, sql=True)

    def __enter__(self) -> NoReturn:
        self._refuse("__enter__")

    def __exit__(self, *_exc: object) -> None:  # never reached: __enter__ raises
        return None

    def _refuse(self, name: str, *, attribute: bool = False, sql: bool = False) -> NoReturn:
        """Remember and raise the violation."""
        if name == "__enter__":
            what = "use it as a context manager (it closes it)"
        elif attribute:
            what = f"take .{name} (the driver's connection beneath it)"
        elif sql:
            what = f"send {name} as SQL"
        else:
            what = f"call {name}()"
        self.violation = FenceViolation(
            f"a handler may not {what} on its connection: it belongs to the worker's "
            "completion transaction, which commits the handler's writes with the receipt")
        raise self.violation

    def check(self) -> None:
        """Raise the violation again if the handler caught it (the attempt still fails)."""
        if self.violation is not None:
            raise self.violation


def run_fenced(apply: Handler, conn: Connection, event: Event) -> str:
    """Run a handler on the fenced view of `conn`; return its checked result_ref.

    A fence violation fails it even if the handler caught it.
    """
    fence = FencedConnection(conn)
    result_ref: object = apply(cast(Connection, fence), event)
    fence.check()
    return check_result_ref(event.event_type, result_ref)


def apply_handler(spec: HandlerSpec | None, conn: Connection, event: Event) -> str:
    """Run the event's handler in the completion transaction; no handler: ignored."""
    return NO_HANDLER_RESULT if spec is None else run_fenced(spec.apply, conn, event)


def check_result_ref(event_type: str, result_ref: object) -> str:
    """Return a handler's result_ref, refusing one that is not a short non-empty str."""
    if not isinstance(result_ref, str) or not 0 < len(result_ref) <= RESULT_REF_LIMIT:
        raise TypeError(f"handler of {event_type} must return a str result_ref of "
                        f"1-{RESULT_REF_LIMIT} characters")
    return result_ref
