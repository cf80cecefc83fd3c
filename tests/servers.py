"""Real servers for tests: gunicorn processes and in-process werkzeug threads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import requests

from ledger.web.loopback import loopback_server

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    """Return a free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_up(base_url: str, process: subprocess.Popen | None = None,
                  timeout: float = 30.0) -> None:
    """Poll /healthz until it answers, failing fast if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if requests.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} did not come up in {timeout}s")


@contextmanager
def _served(command: list[str], port: int, env: dict[str, str], *,
            log_path: Path | None = None, grace: float = 10.0
            ) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run a server `command` listening on `port`; yield its base URL once it answers
    /healthz, and its process; stop it afterwards, however the block ends (killed if it
    has not exited `grace` seconds after SIGTERM).

    Its stderr goes to `log_path` when given (a test reads it), else to a temporary file.
    """
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    # A file, not a pipe: nobody reads a pipe while the server runs, and once its
    # buffer fills (many warning lines while a test stops the database) every
    # worker blocks writing its log and requests hang.
    with (open(log_path, "wb") if log_path else tempfile.TemporaryFile()) as log:
        process = subprocess.Popen(command, cwd=str(ROOT), env=full_env,
                                   stdout=subprocess.DEVNULL, stderr=log,
                                   start_new_session=True)
        base_url = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(base_url, process)
            yield base_url, process
        finally:
            _stop(process, grace)


def gunicorn_server(env: dict[str, str], *, workers: int = 4, extra_args: tuple[str, ...] = (),
                    log_path: Path | None = None
                    ) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Run `gunicorn 'app:create_app()'` on a free loopback port; stop it afterwards."""
    port = free_port()
    return _served([str(BIN / "gunicorn"), "app:create_app()", "--bind", f"127.0.0.1:{port}",
                    "--workers", str(workers), "--log-level", "warning", *extra_args],
                   port, env, log_path=log_path)


def asgi_intake_server(env: dict[str, str], *, workers: int = 2
                       ) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Run the experimental async intake (bench/asgi_intake.py) on a free loopback port."""
    port = free_port()
    return _served([sys.executable, "-m", "bench.asgi_intake", "--bind", f"127.0.0.1:{port}",
                    "--workers", str(workers)], port, env)


def granian_rsgi_server(env: dict[str, str], *, workers: int = 2
                        ) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Run the ledger's app behind granian's RSGI interface (bench/granian_rsgi.py, not
    shipped) on a free loopback port, the head deadline LEDGER_BODY_READ_TIMEOUT_SECONDS;
    `env` names the metrics' shared directory (PROMETHEUS_MULTIPROC_DIR) if it wants one."""
    port = free_port()
    seconds = {**os.environ, **env}.get("LEDGER_BODY_READ_TIMEOUT_SECONDS", "10")
    return _served([str(BIN / "granian"), "--interface", "rsgi", "--factory", "--workers",
                    str(workers), "--http1-header-read-timeout", str(int(1000 * float(seconds))),
                    "--no-ws", "--log-level", "warning", "--host", "127.0.0.1",
                    "--port", str(port), "bench.granian_rsgi:create"], port, env,
                   # granian sometimes leaves a worker running after SIGTERM: kill it sooner.
                   grace=3.0)


def _stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a server we started: TERM, then KILL after `grace` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    if process.stderr is not None:
        process.stderr.close()


@contextmanager
def thread_server(app: Any) -> Iterator[str]:
    """Serve a Flask app from a werkzeug thread on a free loopback port."""
    server = loopback_server(app)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@contextmanager
def sqlite_app(tmp: Path, **settings: str) -> Iterator[Any]:
    """A migrated app (demo handlers on) over a fresh SQLite ledger in `tmp`; closed afterwards."""
    # Imported here: modules that only serve an app they built need not load the product.
    from app import create_app
    from ledger.db.engine import upgrade
    from tests.conftest import TEST_MASTER_KEY

    app = create_app({"DATABASE_URL": f"sqlite:///{tmp / 'ledger.sqlite3'}",
                      "LEDGER_MASTER_KEY": TEST_MASTER_KEY, "LEDGER_VAR_DIR": str(tmp),
                      "LEDGER_SECRET_KEY": "e2e-secret", "LEDGER_DEMO_HANDLERS": "1",
                      **settings})
    try:
        upgrade(app.extensions["ledger"].engine)
        yield app
    finally:
        app.extensions["ledger"].close()
