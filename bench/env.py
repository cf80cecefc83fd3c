"""Bench databases, servers and processes: created for one run, removed afterwards.

PostgreSQL databases are named `ledger_bench_<run>_<name>` on the server of
LEDGER_BENCH_PG_URL (default 127.0.0.1:5432); nothing else is touched.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from cryptography.fernet import Fernet
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from ledger.access import audit
from ledger.access.integrations import create_integration
from ledger.access.secrets_box import SecretBox
from ledger.config import Settings
from ledger.db.engine import upgrade
from ledger.services import ledger_engine

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PG_ADMIN_URL = os.environ.get("LEDGER_BENCH_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SECRET = "whsec_" + "YmVuY2gtc2VjcmV0LWtleS1mb3ItcmVwbGF5LWxlZGdlcg=="
TOLERANCE = 86400  # pre-signed requests stay fresh for the whole run
PASSWORD = "bench admin password"  # of the `bench` admin the page benches create
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def logged_in_client(app: Any) -> Any:
    """Return a test client of `app` signed in as the page benches' `bench` admin."""
    client = app.test_client()
    token = _CSRF.search(client.get("/login").get_data(as_text=True))
    client.post("/login", data={"username": "bench", "password": PASSWORD,
                                "csrf_token": token.group(1) if token else ""})
    return client


@dataclass(slots=True)
class BenchEnv:
    """One run's scratch space: a temp dir, a master key, the databases it made."""

    tmp: Path
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    master_key: str = field(default_factory=lambda: Fernet.generate_key().decode())
    databases: list[str] = field(default_factory=list)

    def pg_url(self, name: str, *, template: str | None = None) -> str:
        """Create database `ledger_bench_<run>_<name>` and return its URL."""
        db = f"ledger_bench_{self.run_id}_{name}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with admin_engine().connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{db}"{clause}'))
        self.databases.append(db)
        return make_url(PG_ADMIN_URL).set(database=db).render_as_string(hide_password=False)

    def migrated_pg(self, name: str) -> str:
        """Return a fresh migrated database (cloned from this run's migrated template)."""
        template = f"ledger_bench_{self.run_id}_template"
        if template not in self.databases:
            url = self.pg_url("template")
            engine = ledger_engine(self.settings(url))
            upgrade(engine)
            engine.dispose()
        return self.pg_url(name, template=template)

    def sqlite_url(self, name: str, *, migrated: bool = True) -> str:
        """Return a SQLite file URL in the temp dir, migrated unless told otherwise."""
        url = f"sqlite:///{self.tmp / (name + '.sqlite3')}"
        if migrated:
            engine = ledger_engine(self.settings(url))
            upgrade(engine)
            engine.dispose()
        return url

    def settings(self, url: str) -> Settings:
        """Return settings for a bench database."""
        return Settings(database_url=url, var_dir=self.tmp, master_key=self.master_key)

    def app_env(self, url: str) -> dict[str, str]:
        """Return the environment for the ledger's own processes on `url`."""
        return {"DATABASE_URL": url, "LEDGER_MASTER_KEY": self.master_key,
                "LEDGER_VAR_DIR": str(self.tmp), "LEDGER_SECRET_KEY": "bench-secret",
                "LEDGER_DEMO_HANDLERS": "1", "LEDGER_LOG_LEVEL": "INFO"}

    def drop_all(self) -> None:
        """Drop every database this run created (templates last)."""
        with admin_engine().connect() as conn:
            for db in sorted(self.databases, key=lambda d: d.endswith("_template")):
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        self.databases.clear()


def admin_engine() -> Engine:
    """Return an autocommit engine on the admin database."""
    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def bench_integration(engine: Engine, box: SecretBox, *, name: str = "bench") -> str:
    """Create the Standard Webhooks integration the load signs for; return its public id."""
    from datetime import UTC, datetime

    with engine.begin() as conn:
        integration, _ = create_integration(
            conn, box, audit.Actor(name="bench", role="admin"), account="bench", name=name,
            profile="standard-webhooks", now=datetime.now(UTC), tolerance=TOLERANCE,
            secret=SECRET)
    return integration.public_id


def free_port() -> int:
    """Return a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The thin baseline is served as `pip install gunicorn` serves it: gunicorn's pure-Python
# HTTP parser. The ledger's gunicorn.conf.py asks for the C parser (gunicorn_h1c, a
# dependency of the ledger and so installed in this venv, where gunicorn's default
# "auto" would pick it for the thin intake too and change the baseline).
THIN_PARSER = ("--http-parser", "python")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerShape:
    """How gunicorn serves: the same shape for the ledger and the thin baseline."""

    workers: int = 4
    worker_class: str = "gthread"
    threads: int = 16  # gunicorn.conf.py's default
    max_requests: int = 5000
    max_requests_jitter: int = 500

    def args(self) -> list[str]:
        """Return the gunicorn flags of this shape."""
        return ["--workers", str(self.workers), "--worker-class", self.worker_class,
                "--threads", str(self.threads), "--max-requests", str(self.max_requests),
                "--max-requests-jitter", str(self.max_requests_jitter), "--keep-alive", "5"]


@contextmanager
def serve(command: list[str], env: dict[str, str], *, cwd: Path, log: Path,
          port: int) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run a server command listening on `port`; stop it (TERM, then KILL) afterwards."""
    with open(log, "ab") as err:
        process = subprocess.Popen(
            command, cwd=str(cwd), env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base, process)
        yield base, process
    finally:
        stop(process)


def gunicorn(app: str, env: dict[str, str], shape: ServerShape, *, cwd: Path, log: Path,
             args: tuple[str, ...] = ()) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve `app` with gunicorn in `shape` on a free port."""
    port = free_port()
    return serve([str(BIN / "gunicorn"), app, "--bind", f"127.0.0.1:{port}", *shape.args(),
                  *args], env, cwd=cwd, log=log, port=port)


def thin_gunicorn(env: dict[str, str], shape: ServerShape, *,
                  log: Path) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve the thin intake (bench/thin_intake.py) in the ledger's shape: THIN_PARSER."""
    return gunicorn("thin_intake:app", env, shape, cwd=ROOT / "bench", log=log, args=THIN_PARSER)


def procfile_web() -> list[str]:
    """Return the Procfile's `web` command, the one `make run`'s docs and systemd serve."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            command = shlex.split(line.removeprefix("web:"))
            return [str(BIN / command[0]), *command[1:]]
    raise LookupError("Procfile has no web line")


def shipped(env: dict[str, str], *,
            log: Path) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve the ledger exactly as the Procfile's web line does (gunicorn.conf.py and the
    settings' defaults, overridden only by what `env` sets), bound to a free port."""
    port = free_port()
    return serve(procfile_web(), {**env, "LEDGER_BIND": f"127.0.0.1:{port}"}, cwd=ROOT,
                 log=log, port=port)


def thin_as_written(env: dict[str, str], workers: int, *,
                    log: Path) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve the thin intake as its user would: `gunicorn -w N thin_intake:app`, sync
    workers, the pure-Python parser of a plain `pip install gunicorn` (THIN_PARSER)."""
    port = free_port()
    return serve([str(BIN / "gunicorn"), "-w", str(workers), "--bind", f"127.0.0.1:{port}",
                  *THIN_PARSER, "thin_intake:app"], env, cwd=ROOT / "bench", log=log,
                 port=port)


def wait_up(base: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Poll /healthz until it answers; fail fast if the server died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        with suppress(requests.RequestException):
            if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{base} did not come up in {timeout}s")


def stop(process: subprocess.Popen, grace: float = 15.0) -> None:
    """Stop a process group we started: TERM, then KILL after `grace` seconds."""
    if process.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def worker_pids(master_pid: int) -> list[int]:
    """Return the pids of a gunicorn master's workers."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def run_alone(name: str, measure: Callable[[BenchEnv], dict[str, Any]]) -> None:
    """Run a measure of its own (`python -m bench.<name>`) on a fresh bench environment,
    dropping its databases afterwards; write its record and print its result."""
    from bench import report

    e = BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-")))
    started = time.perf_counter()
    try:
        result = measure(e)
    finally:
        e.drop_all()
        shutil.rmtree(e.tmp, ignore_errors=True)
    report.write(name, [], result, round(time.perf_counter() - started, 1))
    print(json.dumps(result, indent=2))
