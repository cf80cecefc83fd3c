"""Production gunicorn settings for `gunicorn 'app:create_app()'` (README "Production layout").

Every value can be overridden on the command line or through the environment
variables named below. gunicorn reads ./gunicorn.conf.py by default, so
running from the project directory (or `-c /path/to/gunicorn.conf.py`) uses it.

Metrics: prometheus-client decides at import time whether it writes to shared
files, so PROMETHEUS_MULTIPROC_DIR is set here, in the master, before any
worker is forked and imports the app. Without one configured, a fresh private
directory is made and removed at exit.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

bind = os.environ.get("LEDGER_BIND", "127.0.0.1:8000")
# CPU, not the database, bounds a Python intake (MEASUREMENTS.md): a few
# processes per core, each with a few threads for requests waiting on commits.
workers = int(os.environ.get("WEB_CONCURRENCY", max(2, multiprocessing.cpu_count() * 2)))
worker_class = "gthread"
# 16, not 4: a slow sender holds a thread until its body deadline
# (LEDGER_BODY_READ_TIMEOUT_SECONDS), so the threads are how many of them a process
# absorbs while it keeps serving others. At most LEDGER_DB_POOL_SIZE threads use the
# database at once; the others wait for a connection (at most the pool timeout, then 503).
# Measured faster than 4 too (bench/README.md, "Web server").
threads = int(os.environ.get("LEDGER_WEB_THREADS", "16"))
# A request is bounded by the pool timeout (2 s) and statement_timeout (5 s);
# a worker silent for 30 s is stuck and gets replaced.
timeout = 30
graceful_timeout = 30
keepalive = 5  # behind a proxy that reuses upstream connections
# Senders' headers are small; refuse abuse before the app sees it.
limit_request_line = 4094
limit_request_fields = 64
limit_request_field_size = 8190
# Recycle workers now and then (slow leaks), staggered so they never restart together.
max_requests = 5000
max_requests_jitter = 500
# Load the app once in the master and fork workers from it. Importing and building
# the app costs ~1.3 s of CPU; under load each worker recycles every ~15 s, so
# without preloading the recycles alone took a fifth of a 2-core host and a
# booting worker's queued requests made the latency tail (bench/README.md,
# "Intake CPU"). Safe here: building the app opens no connection (pools fill in
# each worker), the heartbeat thread starts in each worker on its first request,
# and prometheus-client resets its per-process files after a fork.
preload_app = os.environ.get("LEDGER_WEB_PRELOAD", "1") != "0"
accesslog = os.environ.get("LEDGER_ACCESS_LOG") or None  # the app logs JSON lines itself
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
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        path = tempfile.mkdtemp(prefix="ledger-metrics-")
        _PRIVATE_DIR.append(path)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    Path(path).mkdir(parents=True, exist_ok=True)
    for file in Path(path).glob("*.db"):
        match = _PID_IN_NAME.search(file.name)
        if match and not _pid_alive(int(match.group(1))):
            file.unlink(missing_ok=True)
    return path


# Runs when gunicorn reads this file in the master: before any worker exists.
prepare_metrics_dir()


def child_exit(_server: Any, worker: Any) -> None:
    """Drop a dead worker's live gauges; its counters keep counting in the totals."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(_server: Any) -> None:
    """Remove the private metrics directory this master made."""
    for path in _PRIVATE_DIR:
        shutil.rmtree(path, ignore_errors=True)
