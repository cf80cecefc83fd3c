"""Which HTTP server for the web tier: the ledger under gunicorn vs granian or uWSGI.

The same ledger, the same database, the same processes x threads, loaded in
ABBA order (gunicorn, challenger, challenger, gunicorn, twice) with fresh signed
events each run, on PostgreSQL and on SQLite. Only the ratios inside one run
mean anything on this shared machine (bench/README.md, "Web server").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from bench import env as benv
from bench.intake import Target, abba, ours_app, summarize, thin_env
from bench.schemas import create_thin_pg


def granian(env: dict[str, str], shape: benv.ServerShape, *, log: Path,
            app: str = "app:create_app", factory: bool = True,
            ) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve the ledger (or another WSGI `app`) with granian (shape.workers x
    shape.threads); stop it after."""
    port = benv.free_port()
    return _served("granian", [
        "--interface", "wsgi", *(["--factory"] if factory else []), app,
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(shape.workers),
        "--blocking-threads", str(shape.threads), "--no-ws", "--log-level", "warning"],
        port, env, log)


def uwsgi(env: dict[str, str], shape: benv.ServerShape, *,
          log: Path) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Serve the ledger with uWSGI (the `pyuwsgi` wheel), gunicorn.conf.py's limits mapped.

    Prefork with the app loaded in the master (like gunicorn's preload), HTTP/1.1
    keep-alive on the workers' own socket (no router process in between), request
    recycling, header buffer and body limits, harakiri as gunicorn's worker timeout.
    """
    port = benv.free_port()
    return _served("uwsgi", [
        "--master", "--need-app", "--die-on-term", "--http11-socket", f"127.0.0.1:{port}",
        "--module", "app:create_app()", "--processes", str(shape.workers),
        "--threads", str(shape.threads), "--thunder-lock",
        "--max-requests", str(shape.max_requests or 0), "--buffer-size", "8192",
        "--limit-post", str(64 * 1024 * 1024), "--harakiri", "30", "--socket-timeout", "10",
        "--disable-logging", "--worker-reload-mercy", "30"], port, env, log)


@contextmanager
def _served(server: str, args: list[str], port: int, env: dict[str, str],
            log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run `server` (a console script of the venv) from the repository root, each with its
    own Prometheus directory, until it answers on `port`; stop it afterwards."""
    metrics_dir = tempfile.mkdtemp(prefix=f"ledger-bench-{server}-metrics-")
    with open(log, "ab") as err:
        process = subprocess.Popen(
            [str(benv.BIN / server), *args], cwd=str(benv.ROOT), stdout=subprocess.DEVNULL,
            stderr=err, start_new_session=True,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1",
                 "PROMETHEUS_MULTIPROC_DIR": metrics_dir})
    base = f"http://127.0.0.1:{port}"
    try:
        benv.wait_up(base, process)
        yield base, process
    finally:
        benv.stop(process)


def challenger(e: benv.BenchEnv, url: str, shape: benv.ServerShape, against: str,
               log: Path) -> AbstractContextManager[tuple[str, subprocess.Popen]]:
    """Start side B: "granian[:N]" (same shape, or N threads), "uwsgi", "threads:N" (gunicorn)
    or "shape:WORKERSxTHREADS[:CLASS]" (gunicorn in another shape)."""
    if against == "uwsgi":
        return uwsgi(e.app_env(url), shape, log=log)
    if against.startswith("shape:"):
        size, _, klass = against.removeprefix("shape:").partition(":")
        workers, _, per_process = size.partition("x")
        other = replace(shape, workers=int(workers), threads=int(per_process or 1),
                        worker_class=klass or shape.worker_class)
        return benv.gunicorn("app:create_app()", e.app_env(url), other, cwd=benv.ROOT, log=log)
    if against == "granian":
        return granian(e.app_env(url), shape, log=log)
    if against.startswith("granian:"):
        threads = int(against.removeprefix("granian:"))
        return granian(e.app_env(url), replace(shape, threads=threads), log=log)
    if against.startswith("threads:"):
        wider = replace(shape, threads=int(against.removeprefix("threads:")))
        return benv.gunicorn("app:create_app()", e.app_env(url), wider, cwd=benv.ROOT, log=log)
    raise ValueError(f"unknown server to compare against: {against!r}")


def twin_databases(e: benv.BenchEnv, name: str) -> tuple[str, str, str]:
    """Return two identical ledgers (same bench integration) and its public id.

    Both sides replay the same signed files, so each needs its own database:
    on a shared one the second side would only see duplicates.
    """
    if name == "pg":
        first = e.migrated_pg("servers_a")
        public_id = ours_app(e, first)
        second = e.pg_url("servers_b", template=make_url(first).database)
        return first, second, public_id
    first = e.sqlite_url("servers_a")
    public_id = ours_app(e, first)
    path = e.tmp / "servers_b.sqlite3"
    shutil.copyfile(make_url(first).database or "", path)
    return first, f"sqlite:///{path}", public_id


def measure(e: benv.BenchEnv, shape: benv.ServerShape, seconds: float,
            against: str = "granian") -> dict[str, Any]:
    """Gunicorn at `shape` ("thin" side of the ABBA) vs `against` ("ours" side), PG then SQLite."""
    out: dict[str, Any] = {"against": against}
    for name in ("pg", "sqlite"):
        a_url, b_url, public_id = twin_databases(e, name)
        log = e.tmp / f"servers-{name}.log"
        with benv.gunicorn("app:create_app()", e.app_env(a_url), shape, cwd=benv.ROOT,
                           log=log) as (a_base, _), \
                challenger(e, b_url, shape, against, log) as (b_base, _):
            path = f"/hooks/{public_id}"
            runs = abba(e, Target(a_base, a_url, path), Target(b_base, b_url, path), seconds,
                        f"servers-{name}")
        out[name] = summarize(runs)
    return out


def floors(e: benv.BenchEnv, shape: benv.ServerShape, seconds: float) -> dict[str, Any]:
    """The gunicorn floor (bench/floor_intake.py) under gunicorn and under granian against
    the thin intake, on PostgreSQL: what the server alone allows an intake on this machine.

    Three sides in one ABBA (thin, floor under gunicorn, floor under granian, and back),
    each on its own thin-schema database, the same shape and pre-signed requests.
    """
    urls = {name: e.pg_url(f"floors_{name}") for name in ("thin", "gunicorn", "granian")}
    for url in urls.values():
        create_thin_pg(url)
    env = {name: thin_env(url) for name, url in urls.items()}
    path, log = "/hooks/in_floors", e.tmp / "floors.log"
    with benv.thin_gunicorn(env["thin"], shape, log=log) as (thin_base, thin), \
            benv.gunicorn("bench.floor_intake:app", env["gunicorn"], shape, cwd=benv.ROOT,
                          log=log) as (gunicorn_base, under_gunicorn), \
            granian(env["granian"], shape, log=log, app="bench.floor_intake:app",
                    factory=False) as (granian_base, under_granian):
        runs = abba(e, Target(thin_base, urls["thin"], path, thin.pid),
                    Target(gunicorn_base, urls["gunicorn"], path, under_gunicorn.pid), seconds,
                    "floors", floor=Target(granian_base, urls["granian"], path, under_granian.pid))
    return floor_sides(summarize(runs))


FLOOR_SIDES = {"thin": "thin", "ours": "gunicorn_floor", "floor": "granian_floor"}


def floor_sides(out: dict[str, Any]) -> dict[str, Any]:
    """Rename summarize's sides for `floors`: ours is the floor under gunicorn, floor the
    floor under granian ("ours_p99_ms" -> "gunicorn_floor_p99_ms")."""
    def renamed(key: str) -> str:
        name, _, measure = key.partition("_")
        return f"{FLOOR_SIDES[name]}_{measure}"

    return {"runs": {FLOOR_SIDES[k]: v for k, v in out["runs"].items()}} | {
        renamed(key): value for key, value in out.items() if key != "runs"}
