"""The one runner for hot statements sent on the driver connection, past SQLAlchemy's execution.

The intake's claim and the worker's completion run once per event, and
SQLAlchemy's execution machinery (execution context, cursor result, row
objects, type processing) costs about as much Python as the driver call itself.
They run here instead, keeping
what SQLAlchemy would have given them:

- the connection comes from the engine's pool (same connect-time settings and
  timeouts) or is the caller's `Connection`, inside its transaction;
- parameters and rows get the conversions of their SQLAlchemy types
  (timestamps as UTC, e.g. naive UTC text on SQLite);
- a driver error is raised as SQLAlchemy's (`ledger.db.engine.driver_error`),
  without parameters, and a broken connection is invalidated instead of going
  back to the pool.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import namedtuple
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Dialect, Engine, TextClause
from sqlalchemy.sql.selectable import TextualSelect

from ledger.db.engine import RECYCLE_SECONDS, connection_is_alive, driver_error
from ledger.db.schema import UTCDateTime

T = TypeVar("T")
DriverWork = Callable[..., T]  # (driver connection, *args) -> T


def time_to_driver(dialect: Dialect) -> Callable[[Any], Any]:
    """Return what turns an aware datetime into the driver's value, as UTCDateTime binds it."""
    convert = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    return convert if convert is not None else (lambda value: value)


def run_in(conn: Connection, work: DriverWork[T], *args: Any, what: str) -> T:
    """Return `work(driver connection, *args)` on `conn`'s connection, inside its transaction."""
    fairy = conn.connection
    try:
        return work(fairy.driver_connection, *args)
    except conn.dialect.loaded_dbapi.Error as error:
        raise _translated(conn.dialect, error, what, fairy, conn.invalidate) from error


def run_pooled(engine: Engine, work: DriverWork[T], *args: Any, what: str) -> T:
    """Return `work(driver connection, *args)` on a connection of the engine's pool.

    The connection goes back to the pool afterwards, which rolls back whatever
    `work` left open.
    """
    dialect = engine.dialect
    try:
        fairy = engine.raw_connection()  # a failed connect raises the driver's error
    except dialect.loaded_dbapi.Error as error:
        raise driver_error(dialect, error, what=what) from error
    try:
        return work(fairy.driver_connection, *args)
    except dialect.loaded_dbapi.Error as error:
        raise _translated(dialect, error, what, fairy, fairy.invalidate) from error
    finally:
        fairy.close()


def run_autocommit(engine: Engine, work: DriverWork[T], *args: Any, what: str) -> T:
    """Return `work(a cursor, *args)` on a pooled connection in autocommit: one statement is
    its own transaction, with no BEGIN and COMMIT round trips around it."""
    return cast(T, run_pooled(engine, _autocommitted, work, *args, what=what))


class ThreadConnections:
    """Autocommit driver connections of the threads' own, for one hot statement (on a cursor).

    Checking a connection out of the pool for each statement and back, switching it to
    autocommit and back, cost a served delivery about 8 % of its web CPU (the docs'
    performance page). A thread that runs the statement keeps a connection of its own
    instead. It is opened by the engine's pool (the same connect arguments, timeouts
    and checks) and detached from it, so the pool keeps its connections for everything
    else. Before each use it is checked without a round trip (`connection_is_alive`)
    and replaced when the server closed it or when it is older than the pool's recycle
    age; after a driver error it is closed, and the next statement opens another.

    At most `limit` threads (the pool's size) keep one: a process holds at most twice
    LEDGER_DB_POOL_SIZE connections. The others run the statement on a pooled
    connection, in autocommit, as before, within the pool's wait.
    """

    def __init__(self, engine: Engine, limit: int,
                 recycle_seconds: float = RECYCLE_SECONDS) -> None:
        self._engine = engine
        self._recycle = recycle_seconds
        self._local = threading.local()
        self._places = _Places(limit)

    def run(self, work: DriverWork[T], *args: Any, what: str) -> T:
        """Return `work(a cursor of a connection in autocommit, *args)`; driver errors as
        SQLAlchemy's.

        A thread's own connection keeps one cursor for all its statements, where opening and
        closing one around each statement cost the claim a measurable share of its driver
        time; a pooled connection's cursor is closed after its statement.
        """
        dialect = self._engine.dialect
        held = self._held(what)
        if held is None:  # as many threads as the limit keep one: the pool's way
            return run_autocommit(self._engine, work, *args, what=what)
        try:
            return work(held.cursor(), *args)
        except dialect.loaded_dbapi.Error as error:
            self._discard(held.connection)  # whatever it was, the next statement starts afresh
            raise driver_error(dialect, error, what=what) from error

    def _held(self, what: str) -> _Held | None:
        local = self._local
        held: _Held | None = getattr(local, "held", None)
        if held is not None and (time.monotonic() >= held.expires
                                 or not connection_is_alive(held.connection)):
            self._discard(held.connection)
            held = None
        if held is None:
            places = self._places
            if not places.take():
                return None
            try:
                connection = self._open_one(what)
            except BaseException:
                places.give_back()
                raise
            places.add(connection)
            held = local.held = _Held(connection, time.monotonic() + self._recycle)
            # A thread that ends (a development server's thread per request), or the end of
            # this object, gives the connection and its place back: the finalizer holds the
            # places, never this object, so neither keeps the other alive.
            weakref.finalize(held, places.release, connection)
        return held

    def _open_one(self, what: str) -> Any:
        dialect = self._engine.dialect
        opened: Any = None
        try:
            fairy = self._engine.raw_connection()
            opened = fairy.driver_connection
            fairy.detach()  # ours now: the pool opens another when it needs one
            opened.autocommit = True
        except dialect.loaded_dbapi.Error as error:
            if opened is not None:
                with suppress(Exception):
                    opened.close()
            raise driver_error(dialect, error, what=what) from error
        return opened

    def _discard(self, connection: Any) -> None:
        self._local.held = None
        self._places.release(connection)

    def close(self) -> None:
        """Close every thread's connection (the process is stopping)."""
        self._places.close_all()

    def __len__(self) -> int:
        """Return how many connections the threads keep."""
        return len(self._places)


class _Places:
    """The threads' open connections and the free places for more (shared with finalizers)."""

    __slots__ = ("_lock", "_open", "_permits")

    def __init__(self, limit: int) -> None:
        self._permits = threading.BoundedSemaphore(limit) if limit > 0 else None
        self._lock = threading.RLock()  # reentrant: a finalizer may run while it is held
        self._open: set[Any] = set()

    def take(self) -> bool:
        """Take a free place, if there is one."""
        return self._permits is not None and self._permits.acquire(blocking=False)

    def give_back(self) -> None:
        """Give back a place taken for a connection that did not open."""
        if self._permits is not None:
            self._permits.release()

    def add(self, connection: Any) -> None:
        """Count an opened connection in."""
        with self._lock:
            self._open.add(connection)

    def release(self, connection: Any) -> None:
        """Close a thread's connection and free its place (once; close_all may have taken it)."""
        with self._lock:
            if connection not in self._open:
                return
            self._open.discard(connection)
        self.give_back()
        with suppress(Exception):
            connection.close()

    def close_all(self) -> None:
        """Close every connection (their places stay taken: the process is stopping)."""
        with self._lock:
            connections = list(self._open)
            self._open.clear()
        for connection in connections:
            with suppress(Exception):
                connection.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


class _Held:
    """A thread's own connection, its one cursor, and when it is to be replaced."""

    __slots__ = ("__weakref__", "_cursor", "connection", "expires")

    def __init__(self, connection: Any, expires: float) -> None:
        self.connection = connection
        self.expires = expires
        self._cursor: Any = None

    def cursor(self) -> Any:
        """Return the connection's cursor (opened on first use; it closes with it)."""
        if self._cursor is None:
            self._cursor = self.connection.cursor()
        return self._cursor


def _autocommitted(connection: Any, work: DriverWork[T], *args: Any) -> T:
    """Run `work` on a cursor of a pooled connection in autocommit, and give the pool the
    connection back as it was."""
    connection.autocommit = True
    try:
        cursor = connection.cursor()
        try:
            return work(cursor, *args)
        finally:
            cursor.close()
    finally:
        if not connection.closed:
            connection.autocommit = False


def _translated(dialect: Dialect, error: Exception, what: str, fairy: Any,
                invalidate: Callable[[BaseException], None]) -> Exception:
    """Return SQLAlchemy's error for `error`, invalidating the connection if it is broken."""
    return driver_error(dialect, error, what=what, dbapi_connection=fairy.dbapi_connection,
                        invalidate=invalidate)


class PreparedStatement:
    """A statement compiled for one dialect, with its parameter and row conversions."""

    __slots__ = ("_convert_row", "_times", "_to_driver", "sql")

    def __init__(self, statement: TextClause | TextualSelect, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql: str = compiled.string
        self._to_driver = time_to_driver(dialect)
        self._times = [name for name, bind in compiled.binds.items()
                       if isinstance(bind.type, UTCDateTime)]
        self._convert_row = _row_converter(statement, dialect)

    def fetch_one(self, driver_connection: Any, params: dict[str, Any]) -> Any:
        """Execute on the driver connection (`params` may change); return the row or None."""
        cursor = driver_connection.cursor()  # sqlite3's cursors are no context managers
        try:
            return self.fetch_one_on(cursor, params)
        finally:
            cursor.close()

    def fetch_one_on(self, cursor: Any, params: dict[str, Any]) -> Any:
        """Execute on a driver cursor (`params` may change); return the row or None."""
        for name in self._times:
            params[name] = self._to_driver(params[name])
        cursor.execute(self.sql, params)
        values = cursor.fetchone()
        if values is None or self._convert_row is None:
            return values
        return self._convert_row(values)

    def execute_on(self, cursor: Any, params: dict[str, Any]) -> int:
        """Execute on a driver cursor a statement that returns no rows; return its row count."""
        for name in self._times:
            params[name] = self._to_driver(params[name])
        cursor.execute(self.sql, params)
        return int(cursor.rowcount)

    def fetch_all(self, driver_connection: Any, params: dict[str, Any]) -> list[Any]:
        """Execute on the driver connection (`params` may change); return every row."""
        for name in self._times:
            params[name] = self._to_driver(params[name])
        cursor = driver_connection.cursor()
        try:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        finally:
            cursor.close()
        convert = self._convert_row
        return rows if convert is None else [convert(values) for values in rows]


def _row_converter(statement: TextClause | TextualSelect,
                   dialect: Dialect) -> Callable[[Any], Any] | None:
    """Return what turns a driver row into a named row with its columns' conversions."""
    columns = [(col.key, col.type) for col in getattr(statement, "selected_columns", ())]
    if not columns:
        return None  # no declared columns: the driver's values as they are
    # why: the fields are the statement's columns, known only at run time; mypy types a
    # namedtuple only from a literal list of fields.
    shape = namedtuple("DriverRow", [key for key, _ in columns])  # type: ignore[misc]
    readers = [(i, kind.dialect_impl(dialect).result_processor(dialect, None))
               for i, (_, kind) in enumerate(columns)]
    readers = [(i, read) for i, read in readers if read is not None]

    def row(values: Any) -> Any:
        if readers:
            values = list(values)
            for i, read in readers:
                values[i] = read(values[i])
        return shape._make(values)

    return row


class DriverStatement:
    """A SQLAlchemy text statement run on the driver connection, compiled once per dialect."""

    def __init__(self, statement: TextClause | TextualSelect, *, what: str) -> None:
        self.statement = statement
        self.what = what  # names the statement in its errors
        self._prepared: dict[str, PreparedStatement] = {}  # per dialect name

    def prepared(self, dialect: Dialect) -> PreparedStatement:
        """Return the statement compiled for `dialect` (built on first use)."""
        found = self._prepared.get(dialect.name)
        if found is None:
            found = self._prepared[dialect.name] = PreparedStatement(self.statement, dialect)
        return found

    def sql(self, dialect: Dialect) -> str:
        """Return the statement as the driver receives it."""
        return self.prepared(dialect).sql

    def row(self, conn: Connection, params: dict[str, Any]) -> Any:
        """Run in `conn`'s transaction with `params` (a dict it may change); return the row."""
        return run_in(conn, self.prepared(conn.dialect).fetch_one, params, what=self.what)

    def rows(self, conn: Connection, params: dict[str, Any]) -> list[Any]:
        """Run in `conn`'s transaction with `params` (a dict it may change); return all rows."""
        return run_in(conn, self.prepared(conn.dialect).fetch_all, params, what=self.what)

    def execute_alone(self, engine: Engine, params: dict[str, Any]) -> int:
        """Run as a transaction of its own (autocommit, on a pooled connection) with `params`
        (a dict it may change); return the count of rows it changed."""
        return run_autocommit(engine, self.prepared(engine.dialect).execute_on, params,
                              what=self.what)
