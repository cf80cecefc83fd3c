"""Production gunicorn settings for `gunicorn 'app:create_app()'` (docs: how-to/deploy.md).

Every value can be overridden on the command line or through the environment
variables read by ledger.config.WebServerSettings (LEDGER_BIND, WEB_CONCURRENCY,
LEDGER_WEB_THREADS, LEDGER_WEB_PRELOAD, LEDGER_ACCESS_LOG); a bad one stops
gunicorn before it boots, naming the variable. From an installed package (a wheel),
serve `gunicorn -c python:ledger.web.gunicorn_conf 'ledger.app:create_app()'`; in the
project directory gunicorn reads ./gunicorn.conf.py by default, which imports this module,
and `gunicorn 'app:create_app()'` works there.

Metrics: prometheus-client decides at import time whether it writes to shared
files, so PROMETHEUS_MULTIPROC_DIR is set here, in the master, before any
worker is forked and imports the app. Without one configured, a fresh private
directory is made and removed at exit.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ledger.config import WebServerSettings, metrics_multiproc_dir

_web = WebServerSettings.from_env()
bind = _web.bind
workers = _web.workers
# gthread, but the event loop reads each request's head and small body before a thread
# takes it: slow senders hold buffers, not threads (web/buffering_worker.py).
worker_class = "ledger.web.buffering_worker.BufferingThreadWorker"
# LEDGER_WEB_THREADS, by default 4 on PostgreSQL (a process's threads share one interpreter
# lock: 16 answered no more deliveries, with a longer tail) and 16 on SQLite (its threads
# wait on the one writer, and more of them fill each group commit); see
# docs/explanation/performance.md. With more threads than LEDGER_DB_POOL_SIZE, at most the
# pool's size of them use the database at once and the others wait for a connection up to
# LEDGER_DB_POOL_TIMEOUT_MS, then answer 503.
threads = _web.threads
# A request is bounded by the pool timeout (2 s) and statement_timeout (5 s);
# a worker silent for 30 s is stuck and gets replaced.
timeout = 30
graceful_timeout = 30
keepalive = 5  # behind a proxy that reuses upstream connections
# gunicorn's C HTTP parser (gunicorn_h1c, picohttpparser) when it is installed (the `fast`
# extra), else gunicorn's pure-Python parser: the same limits and answers either way
# (tests/integration/test_http_parser.py), the C one with less CPU per request
# (docs: how-to/deploy.md). `--http-parser python` on the command line (or
# GUNICORN_CMD_ARGS) chooses the Python parser even when the C one is there.
http_parser = "fast" if importlib.util.find_spec("gunicorn_h1c") is not None else "python"
# Senders' headers are small; refuse abuse before the app sees it.
limit_request_line = 4094
limit_request_fields = 64
limit_request_field_size = 8190
# Recycle workers now and then (slow leaks), staggered so they never restart together.
# Each recycle costs a fork, a new pool and cold caches: every 5,000 requests that was
# about 3 % of the intake's throughput on 2 cores; every 50,000 (a few minutes per process
# under load) it is a tenth of that, and a process grows by a few percent over as many
# requests (docs: explanation/performance.md, the sweep and the memory row).
max_requests = 50_000
max_requests_jitter = 5_000
# Load the app once in the master and fork workers from it. Importing and building
# the app costs ~1.3 s of CPU; when workers recycled every 5,000 requests (every ~15 s
# each under load), without preloading the recycles alone took a fifth of a 2-core host,
# and a booting worker's queued requests make the latency tail. Safe here: building the
# app opens no connection (pools fill in each worker), the heartbeat thread starts
# in each worker on its first request, and prometheus-client resets its
# per-process files after a fork.
preload_app = _web.preload
accesslog = _web.access_log  # the app logs JSON lines itself
errorlog = "-"
proc_name = "ledger-web"

_PRIVATE_DIR: list[str] = []
_PID_IN_NAME = re.compile(r"_(\d+)\.db$")


def _pid_alive(pid: int) -> bool:
    """Tell whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_metrics_dir() -> str:
    """Set PROMETHEUS_MULTIPROC_DIR (made if missing) and drop files of dead processes.

    Files of live processes stay: `ledger worker` and `ledger scheduler` on this
    host may share the directory and be running already.
    """
    path = metrics_multiproc_dir()
    if not path:
        path = tempfile.mkdtemp(prefix="ledger-metrics-")
        _PRIVATE_DIR.append(path)
        # prometheus-client reads it from the environment in every forked worker.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    Path(path).mkdir(parents=True, exist_ok=True)
    for file in Path(path).glob("*.db"):
        match = _PID_IN_NAME.search(file.name)
        if match and not _pid_alive(int(match.group(1))):
            file.unlink(missing_ok=True)
    return path


# Runs when gunicorn reads this file in the master: before any worker exists.
prepare_metrics_dir()


def pre_fork(_server: Any, _worker: Any) -> None:
    """Freeze the master's objects (the preloaded app) just before each worker is forked.

    A full collection in a worker walks every tracked object and writes its GC header:
    on the preloaded app's objects, which the worker shares with the master, each
    write copies a page. Unfrozen, one such collection per worker takes 300-870 ms
    (0 objects freed), holding the GIL while every thread of that worker waits; frozen,
    the collections take 1-20 ms. Frozen objects are never collected, even if they
    later become garbage; the app's objects live as long as the process.
    """
    gc.freeze()


def child_exit(_server: Any, worker: Any) -> None:
    """Drop a dead worker's live gauges; its counters keep counting in the totals."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def worker_exit(_server: Any, worker: Any) -> None:
    """Deregister the worker and write the delivery log's buffer before it exits.

    Without the deregistration a stopped worker's instance row (and its credential view
    age on /metrics) would linger until its heartbeat went stale.
    """
    services = getattr(getattr(worker, "wsgi", None), "extensions", {}).get("ledger")
    if services is not None:
        if services.heartbeat is not None:
            services.heartbeat.stop()
        services.delivery_log.close()


def on_exit(_server: Any) -> None:
    """Remove the private metrics directory this master made."""
    for path in _PRIVATE_DIR:
        shutil.rmtree(path, ignore_errors=True)
