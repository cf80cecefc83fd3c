"""Shared fixtures: one parametrized database fixture runs every ledger test on SQLite AND
PostgreSQL, each test on its own database cloned from a migrated template."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledger.config import Settings
from ledger.db.engine import make_engine, upgrade
from tests.integration.pgbouncer import PrivatePgBouncer

PG_ADMIN_URL = os.environ.get(
    "LEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# LEDGER_TEST_VIA_PGBOUNCER=1 (the Makefile's second run): every database test runs on
# PostgreSQL through a private PgBouncer in transaction mode, with LEDGER_DB_PGBOUNCER=1.
VIA_PGBOUNCER = os.environ.get("LEDGER_TEST_VIA_PGBOUNCER", "").lower() in ("1", "true", "yes")
DB_VARIANTS = ["pgbouncer"] if VIA_PGBOUNCER else ["sqlite", "postgresql"]
if VIA_PGBOUNCER:  # every app, CLI and process a test starts inherits the PgBouncer mode
    os.environ["LEDGER_DB_PGBOUNCER"] = "1"
TEST_MASTER_KEY = Fernet.generate_key().decode()
TEST_AUDIT_KEY = "test-audit-key-" + uuid.uuid4().hex
CITUS_TESTS = "tests/integration/test_citus.py"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which whole groups of tests were skipped on this machine, and why.

    Under pytest-xdist the modules are collected in the workers, so the controller's
    LOUD_SKIPS is empty: a skipped Citus test in the reports brings its reason back.
    """
    from tests.integration.citus_cluster import LOUD_SKIPS, citus_skip_reason

    reasons = list(LOUD_SKIPS)
    skipped = terminalreporter.stats.get("skipped", [])
    if any(getattr(report, "nodeid", "").startswith(CITUS_TESTS) for report in skipped):
        reason = citus_skip_reason()
        if reason is not None and reason not in reasons:
            reasons.append(reason)
    for reason in reasons:
        terminalreporter.write_line(f"!!! {reason} !!!", yellow=True, bold=True)


def _pg_reachable(url: str) -> str | None:
    """Return None when the server answers, else the reason it does not."""
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return None
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    finally:
        engine.dispose()


def _start_throwaway_cluster(tmp: Path) -> str | None:
    """Start a private PostgreSQL from the installed binaries (pytest-postgresql)."""
    try:
        from pytest_postgresql.executors import PostgreSQLExecutor
    except ImportError:
        try:
            from pytest_postgresql.executor import PostgreSQLExecutor  # older releases
        except ImportError:
            return None
    pg_ctl = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None)
    if pg_ctl is None or os.geteuid() == 0:  # initdb refuses to run as root
        return None
    executor = PostgreSQLExecutor(
        executable=str(pg_ctl), host="127.0.0.1", port=55432, datadir=str(tmp / "pgdata"),
        unixsocketdir=str(tmp), logfile=str(tmp / "pg.log"), startparams="-w",
        dbname="postgres", user="postgres", password="", options="", postgres_options="")
    executor.start()
    _THROWAWAY.append(executor)
    return "postgresql+psycopg://postgres@127.0.0.1:55432/postgres"


_THROWAWAY: list[object] = []


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """Return an admin URL of a PostgreSQL server, or None (never in CI) with a loud note."""
    reason = _pg_reachable(PG_ADMIN_URL)
    if reason is None:
        yield PG_ADMIN_URL
        return
    if IN_CI:
        pytest.fail(f"CI=true and PostgreSQL at {PG_ADMIN_URL} is unreachable ({reason}); "
                    "PostgreSQL tests must run in CI", pytrace=False)
    url = _start_throwaway_cluster(tmp_path_factory.mktemp("pg"))
    if url is None:
        print(f"\n!!! PostgreSQL unreachable ({reason}) and no throwaway cluster could "
              "be started: every PostgreSQL test is SKIPPED on this machine !!!\n")
    yield url
    for executor in _THROWAWAY:
        executor.stop()  # type: ignore[attr-defined]


def _settings(url: str, tmp: Path) -> Settings:
    """Settings for a test database."""
    return Settings(database_url=url, var_dir=tmp, master_key=TEST_MASTER_KEY)


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str | None) -> Iterator[str | None]:
    """Create and migrate a template database once per session."""
    if pg_admin_url is None:
        yield None
        return
    name = f"ledger_tmpl_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(_settings(url, Path("/tmp")))
    upgrade(engine)
    engine.dispose()
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Migrate one SQLite file per session; tests copy it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.sqlite3"
    engine = make_engine(_settings(f"sqlite:///{path}", path.parent))
    upgrade(engine)
    engine.dispose()
    return path


def _pg_database(pg_admin_url: str, template: str | None) -> Iterator[str]:
    """Clone the template (or, without one, create an empty database); drop it afterwards."""
    name = f"ledger_t_{uuid.uuid4().hex[:12]}"
    clone = f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{clone}'))
    try:
        yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pgbouncer(pg_admin_url: str | None) -> Iterator[PrivatePgBouncer | None]:
    """A private PgBouncer (transaction pooling) in front of the test server, or None."""
    if pg_admin_url is None:
        yield None
        return
    bouncer = PrivatePgBouncer(pg_admin_url)
    try:
        bouncer.start()
    except Exception as error:
        bouncer.stop()
        if IN_CI:
            pytest.fail(f"CI=true and PgBouncer could not start: {error}", pytrace=False)
        print(f"\n!!! PgBouncer could not start ({error}): every PgBouncer test is "
              "SKIPPED on this machine !!!\n")
        yield None
        return
    yield bouncer
    bouncer.stop()


@pytest.fixture(params=DB_VARIANTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database URL: every test using it runs on both engines.

    With LEDGER_TEST_VIA_PGBOUNCER=1 the one variant is PostgreSQL through PgBouncer.
    """
    if request.param == "sqlite":
        path = tmp_path / "ledger.sqlite3"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    yield from _pg_or_skip(request)


def _pg_or_skip(request: pytest.FixtureRequest) -> Iterator[str]:
    """Yield a fresh PostgreSQL database, or skip loudly outside CI when none exists.

    The database is created on the server itself (PgBouncer's transaction pooling
    cannot run CREATE DATABASE reliably); in the PgBouncer run its URL goes through it.
    """
    admin = request.getfixturevalue("pg_admin_url")
    template = request.getfixturevalue("pg_template")
    if admin is None or template is None:
        pytest.skip("PostgreSQL unavailable on this machine (never skipped in CI)")
    bouncer = request.getfixturevalue("pgbouncer") if VIA_PGBOUNCER else None
    if VIA_PGBOUNCER and bouncer is None:
        pytest.skip("PgBouncer unavailable on this machine (never skipped in CI)")
    for url in _pg_database(admin, template):
        yield url if bouncer is None else bouncer.url(make_url(url).database or "")


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no tables at all, never migrated, on both engines."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    admin = request.getfixturevalue("pg_admin_url")
    if admin is None:
        pytest.skip("PostgreSQL unavailable on this machine (never skipped in CI)")
    yield from _pg_database(admin, None)


@pytest.fixture
def empty_engine(empty_db_url: str, tmp_path: Path) -> Iterator[Any]:
    """An engine on `empty_db_url` (tests migrate it with tests.helpers.migrate_to)."""
    engine = make_engine(Settings(database_url=empty_db_url, var_dir=tmp_path,
                                  master_key=TEST_MASTER_KEY))
    yield engine
    engine.dispose()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database for tests that only make sense there."""
    yield from _pg_or_skip(request)


@pytest.fixture
def test_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment overrides for an app or CLI on the test database."""
    return {
        "DATABASE_URL": db_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
        "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY,
        "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "test-secret-key",
        "LEDGER_DEMO_HANDLERS": "1",
    }


@pytest.fixture
def app(test_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """The web app on a fresh database (both engines)."""
    from app import create_app

    application = create_app(test_env)
    yield application
    application.extensions["ledger"].close()


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    """A test client of the app."""
    return app.test_client()


@pytest.fixture
def runner(app):  # type: ignore[no-untyped-def]
    """A CLI runner bound to the app."""
    return app.test_cli_runner()
