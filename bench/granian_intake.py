"""The ledger's own WSGI app served by granian, measured: `python -m bench.run --only granian`.

Not the shipped server and not in the Procfile. granian's HTTP server and its worker
threads' handoff are Rust (hyper on tokio), so it spends less of a web process's CPU per
request than gunicorn; this measure tells how much of the intake targets that buys with
the ledger's code unchanged, and whether granian keeps the intake's slow-sender bound.

The load: the thin intake as written, the floor, and the ledger's app under granian two
ways, each with the shipped number of processes: `app:create_app()` on granian's WSGI
interface (the shipped threads per process), and bench/granian_rsgi.py on its RSGI
interface (each body read on the process's event loop within the deadline, then the app
called on the loop, one request at a time). Each side runs in turn then in reverse, fresh
events every run, the same wrk load as the intake measure. The ledger as shipped is not
loaded beside them: with it, the five servers' connections would pass a default
PostgreSQL's 100; `--only intake` measures it against the same baselines.

The slow-body probe, on three small servers of one process each (granian's WSGI interface
and the ledger as shipped with two threads, and the RSGI adapter) with a body deadline of
PROBE_DEADLINE_SECONDS: open SLOW_SOCKETS connections that send a delivery's head and one
byte of its body, then one more byte every second; ask /healthz beside them; count the
slow sockets answered or closed by the deadline plus PROBE_MARGIN_SECONDS. granian hands
the request to a thread before its body has arrived, and a read of `wsgi.input` waits for
the body with no deadline of its own; the RSGI adapter waits for bodies as coroutines.
"""

from __future__ import annotations

import select
import socket
import tempfile
import time
from contextlib import AbstractContextManager, ExitStack, suppress
from pathlib import Path
from subprocess import Popen
from typing import Any
from urllib.parse import urlsplit

import requests
from sqlalchemy.engine import make_url

from bench import env as benv
from bench.intake import abba, ours_app, sides_summary, started, thin_env
from bench.schemas import create_thin_pg
from ledger.config import WebServerSettings, declared

PROBE_DEADLINE_SECONDS = 3
PROBE_MARGIN_SECONDS = 3
PROBE_THREADS = 2
SLOW_SOCKETS = 2 * PROBE_THREADS
HEALTHZ_WAIT_SECONDS = 3.0


def metrics_env(env: dict[str, str], log: Path) -> dict[str, str]:
    """Return `env` with a fresh PROMETHEUS_MULTIPROC_DIR beside `log`: granian's processes
    keep their metrics in shared files, as the shipped server's do."""
    metrics = Path(tempfile.mkdtemp(prefix="granian-metrics-", dir=log.parent))
    return {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}


def _granian(env: dict[str, str], log: Path, interface: str, target: str, workers: int,
             *extra: str) -> AbstractContextManager[tuple[str, Popen[bytes]]]:
    """Serve `target` with granian's `interface` in `workers` processes, on a free port, a
    head deadline of LEDGER_BODY_READ_TIMEOUT_SECONDS, the metrics in shared files."""
    port = benv.free_port()
    env = metrics_env(env, log)
    # The deadline the ledger reads from the same environment (its declared default if unset).
    head_ms = int(1000 * declared("LEDGER_BODY_READ_TIMEOUT_SECONDS").read(env))
    return benv.serve([str(benv.BIN / "granian"), "--interface", interface, "--factory",
                       "--workers", str(workers), *extra,
                       "--http1-header-read-timeout", str(head_ms), "--no-ws",
                       "--log-level", "warning", "--host", "127.0.0.1", "--port", str(port),
                       target], env, cwd=benv.ROOT, log=log, port=port)


def granian_server(env: dict[str, str], workers: int, threads: int, *,
                   log: Path) -> AbstractContextManager[tuple[str, Popen[bytes]]]:
    """Serve `app:create_app()` with granian's WSGI interface: `workers` processes of
    `threads` blocking threads."""
    return _granian(env, log, "wsgi", "app:create_app", workers,
                    "--blocking-threads", str(threads))


def rsgi_server(env: dict[str, str], workers: int, *,
                log: Path) -> AbstractContextManager[tuple[str, Popen[bytes]]]:
    """Serve bench/granian_rsgi.py with granian's RSGI interface: `workers` processes,
    each reading bodies on its event loop."""
    return _granian(env, log, "rsgi", "bench.granian_rsgi:create", workers)


def slow_body_probe(base: str, path: str) -> dict[str, Any]:
    """Hold SLOW_SOCKETS bodies open one byte a second; return how the server coped."""
    parts = urlsplit(base)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            "Content-Length: 64\r\n\r\n{").encode()
    slow: list[socket.socket] = []
    opened = time.monotonic()
    try:
        for _ in range(SLOW_SOCKETS):
            connection = socket.create_connection(address, timeout=5)
            connection.sendall(head)
            slow.append(connection)
        time.sleep(1.0)  # every thread that would read a body has one
        asked = time.monotonic()
        healthz: float | None = None
        with suppress(requests.RequestException):
            if requests.get(f"{base}/healthz", timeout=HEALTHZ_WAIT_SECONDS).status_code == 200:
                healthz = round(time.monotonic() - asked, 2)
        ended = _trickle(slow, opened + PROBE_DEADLINE_SECONDS + PROBE_MARGIN_SECONDS)
    finally:
        for connection in slow:
            connection.close()
    return {"slow_sockets": SLOW_SOCKETS, "healthz_seconds": healthz,
            "healthz_wait_seconds": HEALTHZ_WAIT_SECONDS, "ended": ended,
            "deadline_seconds": PROBE_DEADLINE_SECONDS, "margin_seconds": PROBE_MARGIN_SECONDS}


def _trickle(slow: list[socket.socket], until: float) -> int:
    """Send each open slow socket one byte a second until `until`; return how many the
    server answered or closed by then."""
    open_ = list(slow)
    ended = 0
    while open_ and time.monotonic() < until:
        readable, _, _ = select.select(open_, [], [], min(1.0, max(until - time.monotonic(), 0)))
        for connection in readable:  # an answer (408) or the server's close
            open_.remove(connection)
            ended += 1
        for connection in list(open_):
            try:
                connection.sendall(b" ")
            except OSError:
                open_.remove(connection)
                ended += 1
    return ended


def measure(e: benv.BenchEnv, seconds: float, rounds: int = 2) -> dict[str, Any]:
    """granian serving the ledger (its WSGI interface, and RSGI with bodies read on the
    loop) vs the floor vs the thin intake as written, on PostgreSQL, in one run; then the
    slow-body probe."""
    ours_url = e.migrated_pg("granian_granian")
    web = WebServerSettings.from_env({"DATABASE_URL": ours_url})
    shape = benv.ServerShape(workers=web.workers, threads=web.threads)
    path = f"/hooks/{ours_app(e, ours_url)}"
    ours_db = str(make_url(ours_url).database)
    # The RSGI side gets a copy of the WSGI side's ledger: the same integration.
    urls = {"granian": ours_url, "rsgi": e.pg_url("granian_rsgi", template=ours_db)} | {
        name: e.pg_url(f"granian_{name}") for name in ("thin", "floor")}
    for name in ("thin", "floor"):
        create_thin_pg(urls[name])
    log = e.tmp / "intake-granian.log"
    with ExitStack() as stack:
        servers = {
            "granian": granian_server(e.app_env(urls["granian"]), web.workers, web.threads,
                                      log=log),
            "rsgi": rsgi_server(e.app_env(urls["rsgi"]), web.workers, log=log),
            "floor": benv.gunicorn("bench.floor_intake:app", thin_env(urls["floor"]), shape,
                                   cwd=benv.ROOT, log=log),
            "thin": benv.thin_as_written(thin_env(urls["thin"]), web.workers, log=log)}
        sides = started(stack, servers, urls, path)
        # abba names its first side "ours": the path every side is sent to.
        sides = {"ours": sides.pop("granian"), **sides}
        runs = abba(e, sides, seconds, "granian", cycles=rounds)
        runs["granian"], sides["granian"] = runs.pop("ours"), sides.pop("ours")
    return sides_summary(runs, sides) | {
        "probe": probe(e), "workers": web.workers, "threads": web.threads, "rounds": rounds}


def probe(e: benv.BenchEnv) -> dict[str, Any]:
    """Run the slow-body probe on granian (WSGI, then RSGI) and on the ledger as shipped
    (one process each)."""
    url = e.migrated_pg("granian_probe")
    path = f"/hooks/{ours_app(e, url)}"
    env = e.app_env(url) | {"LEDGER_BODY_READ_TIMEOUT_SECONDS": str(PROBE_DEADLINE_SECONDS),
                            "WEB_CONCURRENCY": "1", "LEDGER_WEB_THREADS": str(PROBE_THREADS)}
    log = e.tmp / "granian-probe.log"
    found = {}
    with granian_server(env, 1, PROBE_THREADS, log=log) as (base, _):
        found["granian"] = slow_body_probe(base, path)
    with rsgi_server(env, 1, log=log) as (base, _):
        found["rsgi"] = slow_body_probe(base, path)
    with benv.shipped(env, log=log) as (base, _):
        found["ours"] = slow_body_probe(base, path)
    return found
