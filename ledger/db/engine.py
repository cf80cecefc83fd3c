"""Engines, migrations and the translation of driver failures into domain errors."""

from __future__ import annotations

import os
import select
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import psycopg
from sqlalchemy import Connection, Engine, Table, create_engine, event, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from ledger.config import Settings
from ledger.db.writer_turns import connection_factory
from ledger.errors import StorageUnavailable, UnsupportedDatabase

if TYPE_CHECKING:
    from alembic.config import Config

# The oldest databases the ledger's SQL runs on: the rollups bin hours with date_bin
# (PostgreSQL 14); claims and failure groups use RETURNING (SQLite 3.35).
MIN_POSTGRES = 140000  # server_version_num
MIN_SQLITE = (3, 35, 0)
# Connections older than this are replaced (the pool's, and the intake claim's own).
RECYCLE_SECONDS = 1800


def conflict_insert(conn: Connection, table: Table) -> Any:
    """Return the connection's dialect's INSERT for `table`, which knows ON CONFLICT."""
    dialect: Any = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def make_engine(settings: Settings, **overrides: Any) -> Engine:
    """Create the engine for DATABASE_URL with timeouts that keep requests bounded."""
    url = settings.database_url
    if url.startswith("sqlite"):
        return _sqlite_engine(url, settings, **overrides)
    options = (f"-c statement_timeout={settings.statement_timeout_ms} "
               f"-c lock_timeout={settings.lock_timeout_ms} "
               "-c idle_in_transaction_session_timeout=60000")
    connect_args: dict[str, Any] = {"connect_timeout": 3, "options": options}
    if settings.db_pgbouncer:
        # Transaction pooling: a server connection changes between transactions, so
        # session state (startup options, prepared statements) cannot be relied on.
        # The timeouts move to the role: ALTER ROLE ... SET statement_timeout (README).
        connect_args = {"connect_timeout": 3, "prepare_threshold": None}
    kwargs: dict[str, Any] = {
        "pool_size": settings.pool_size,
        "max_overflow": 0,
        # A request that cannot get a connection quickly answers 503 instead of hanging.
        "pool_timeout": settings.pool_timeout_seconds,
        "pool_recycle": RECYCLE_SECONDS,
        "connect_args": connect_args,
    }
    kwargs.update(overrides)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _refuse_old_server)
    event.listen(engine, "checkout", _refuse_dead_connection)
    return engine


def _refuse_old_server(dbapi_connection: Any, _record: Any) -> None:
    """New connection: refuse a PostgreSQL server older than MIN_POSTGRES, by name."""
    version = getattr(getattr(dbapi_connection, "info", None), "server_version", 0)
    if version and version < MIN_POSTGRES:
        raise UnsupportedDatabase(
            f"PostgreSQL {version // 10000} is too old for the ledger: it needs PostgreSQL "
            f"{MIN_POSTGRES // 10000} or later (README, Limits)")


def connection_is_alive(dbapi_connection: Any) -> bool:
    """Tell, without a round trip, whether an idle psycopg connection may still be used.

    A server that ends a connection (pg_terminate_backend, a crash restart, a
    shutdown) sends its farewell and closes the socket; an idle connection that
    has anything to read is therefore taken as gone. One poll() call (~1 us of
    CPU) instead of pre-ping's SELECT 1 (a round trip, ~0.2 ms, per request).
    Anything but a psycopg connection (SQLite) is alive.
    """
    pgconn = getattr(dbapi_connection, "pgconn", None)
    if pgconn is None:
        return True
    if dbapi_connection.closed or dbapi_connection.broken:
        return False
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


def _refuse_dead_connection(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Pool checkout: hand out no connection the server has closed (the pool reconnects)."""
    if not connection_is_alive(dbapi_connection):
        raise sa_exc.DisconnectionError("the server closed this pooled connection")


def _private_file(database: str) -> None:
    """Create the SQLite file readable by its owner only, and tighten one that is not.

    The file holds encrypted secrets, payloads and operator hashes. SQLite gives the
    WAL and shared-memory files the database file's mode, so 0600 here covers them.
    """
    path = Path(database)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    except OSError:  # unopenable: the first connection says so, and requests answer 503
        return
    for name in (path, Path(f"{database}-wal"), Path(f"{database}-shm")):
        try:
            if name.exists() and name.stat().st_mode & 0o077:
                name.chmod(0o600)
        except OSError:  # not ours to change (a shared file set up by hand): leave it
            continue


# SQLite's busy timeout: how long a writer waits for the database's lock (seconds).
SQLITE_BUSY_SECONDS = 10


def sqlite_file(database: str | None) -> TypeGuard[str]:
    """Tell whether a SQLite URL's database is a file of its own (not memory, not a URI)."""
    return database is not None and database not in ("", ":memory:") and not database.startswith(
        "file:")


def _sqlite_engine(url: str, settings: Settings, **overrides: Any) -> Engine:
    """Create a SQLite engine in WAL mode whose transactions take the write lock up front."""
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise UnsupportedDatabase(
            f"SQLite {sqlite3.sqlite_version} is too old for the ledger: it needs SQLite "
            f"{'.'.join(map(str, MIN_SQLITE))} or later (README, Limits)")
    connect_args: dict[str, Any] = {"timeout": SQLITE_BUSY_SECONDS, "check_same_thread": False}
    database = make_url(url).database
    if sqlite_file(database):
        _private_file(database)
        # Each transaction waits for its writer turn before BEGIN IMMEDIATE
        # (ledger.db.writer_turns): the kernel's queue, not the busy handler's sleeps.
        connect_args["factory"] = connection_factory(database)
    kwargs: dict[str, Any] = {"connect_args": connect_args}
    kwargs.update(overrides)
    engine = create_engine(url, **kwargs)
    synchronous = settings.sqlite_synchronous
    if synchronous not in ("FULL", "NORMAL", "EXTRA"):
        raise ValueError("LEDGER_SQLITE_SYNCHRONOUS must be FULL, NORMAL or EXTRA")

    @event.listens_for(engine, "connect")
    def _configure(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the driver so that BEGIN is ours.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SECONDS * 1000}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock at BEGIN: concurrent claimers queue on
        # busy_timeout instead of failing when a read lock must be upgraded.
        dbapi_conn = conn.connection.dbapi_connection
        take_turn = getattr(dbapi_conn, "take_turn", None)
        if take_turn is not None:
            take_turn()
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            if take_turn is not None:
                dbapi_conn.end_turn()  # type: ignore[union-attr]
            raise

    return engine


def snapshot_engine(url: str) -> Engine | None:
    """On a SQLite file, an engine for reads alone: each transaction a snapshot, no turn.

    The ledger's engine begins every SQLite transaction with its writer turn and
    `BEGIN IMMEDIATE`, so a page being read would hold the one writer, and the intake
    with it, for as long as it takes. In WAL mode a reader needs neither: a deferred
    `BEGIN` reads one snapshot while writers commit. `query_only` makes a write through
    this engine an error instead of a lock upgrade. None on PostgreSQL and in memory.
    """
    if not url.startswith("sqlite"):
        return None
    if not sqlite_file(make_url(url).database):
        return None
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_SECONDS,
                                              "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # BEGIN is ours, as on the ledger's engine
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SECONDS * 1000}")
        cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def alembic_config(url: str | None = None) -> Config:
    """Return an Alembic config that finds migrations through the installed package."""
    # Alembic is imported where it is used: a command that never migrates (`ledger receipt
    # show`) starts without it, about a tenth of a second sooner.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).resolve().parent / "migrations"))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine) -> None:
    """Migrate the database behind `engine` to the newest revision."""
    from alembic import command

    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def migration_status(engine: Engine) -> tuple[str | None, str | None]:
    """Return (current revision, head revision)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


def driver_error(dialect: Any, error: Exception, *, what: str, dbapi_connection: Any = None,
                 invalidate: Callable[[BaseException], None] | None = None,
                 ) -> sa_exc.StatementError:
    """Return the SQLAlchemy error for a driver error raised outside SQLAlchemy.

    For statements run on the driver connection directly (the hot paths, all
    through ledger.db.driver): the rest of the ledger
    handles SQLAlchemy's errors, and parameters never appear in the message.
    When the error means the connection is gone, `invalidate` is called (so it
    never goes back to the pool) and the error says so, as SQLAlchemy's would.
    """
    invalidated = (invalidate is not None
                   and dialect.is_disconnect(error, dbapi_connection, None))
    if invalidate is not None and invalidated:
        invalidate(error)
    return sa_exc.DBAPIError.instance(what, None, error, dialect.loaded_dbapi.Error,
                                      hide_parameters=True, connection_invalidated=invalidated,
                                      dialect=dialect)


def is_unavailable(error: BaseException) -> bool:
    """Tell whether a driver error means the database is unreachable or overloaded."""
    if isinstance(error, sa_exc.TimeoutError):  # pool exhausted
        return True
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        return isinstance(error, sa_exc.OperationalError)
    return False


@contextmanager
def storage_guard() -> Iterator[None]:
    """Translate connection-level failures into StorageUnavailable."""
    try:
        yield
    except (sa_exc.DBAPIError, sa_exc.TimeoutError) as error:
        if is_unavailable(error):
            raise StorageUnavailable(type(error).__name__) from error
        raise


# Notice PostgreSQL sends when a cancel ends a COMMIT's wait for a synchronous standby:
# the commit stood locally but no standby confirmed it.
SYNC_WAIT_CANCELLED = "canceling wait for synchronous replication"


def commit_stall(engine: Engine, seconds: float) -> str | None:
    """Commit one transaction that writes WAL; return why commits stall, or None if they do not.

    `SELECT 1` answers while every commit hangs (a synchronous standby gone): a
    ready check must commit like the intake does. The probe rewrites the one row of
    alembic_version in place (a transaction that writes no WAL waits for no standby),
    so its COMMIT waits exactly as a receipt's would. statement_timeout does not
    reach a COMMIT's wait for a standby, so a timer cancels it after `seconds`; the
    server then ends the wait with a warning, which is the sign.
    """
    if engine.dialect.name != "postgresql":
        with engine.begin() as conn:  # SQLite: the write lock a receipt needs
            conn.exec_driver_sql("SELECT 1")
        return None
    notices: list[str] = []
    with engine.connect() as conn:
        driver: Any = conn.connection.driver_connection

        def keep(diagnostic: Any) -> None:
            notices.append(str(diagnostic.message_primary or ""))

        fired = threading.Event()

        def cancel_commit() -> None:
            fired.set()
            driver.cancel()

        driver.add_notice_handler(keep)
        timer = threading.Timer(seconds, cancel_commit)
        try:
            with conn.begin():
                conn.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
                timer.start()
        finally:
            timer.cancel()
            if timer.is_alive():
                timer.join()
            driver.remove_notice_handler(keep)
            if fired.is_set():  # a late cancel must not reach the pool's next user
                conn.invalidate()
    if any(SYNC_WAIT_CANCELLED in notice for notice in notices):
        return f"commits wait over {seconds:g} s for a synchronous standby"
    return None
