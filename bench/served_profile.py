"""Where a served web process's CPU goes: a profile of every thread of one gunicorn worker.

    .venv/bin/python -m bench.served_profile [--seconds 15]

`bench.intake_profile` times the app alone, called in process; this serves the ledger as
shipped (the Procfile's gunicorn settings, one worker) under wrk's load of fresh signed
events and profiles the worker's threads by their own CPU time (`time.thread_time`): the
event loop that reads requests, and the threads that parse them, run the app and write the
answers. Each function's own time is summed by where its code lives (gunicorn's modules,
the ledger's, the driver, the socket calls). Profiling slows every call, so read the
shares, not the absolute figures; and each profiled call reads the thread's CPU clock, a
system call of its own, so a call that is cheap alone (a socket option, `os.getpid`) shows
many times its cost: time a suspect alone before acting on its share. Writes
bench/results/served_profile.json.
"""

from __future__ import annotations

import argparse
import glob
import pstats
from typing import Any

from bench import env as benv
from bench.intake import Target, load_run, ours_app, signed_files
from bench.intake_profile import shares

# The gunicorn configuration of the profiled server: the shipped one, plus a profiler per
# thread, each written out when the worker exits.
HOOKS = '''
import cProfile, os, threading, time
from ledger.web.gunicorn_conf import *  # noqa: F403
from ledger.web.gunicorn_conf import worker_exit as shipped_worker_exit

workers = 1
_PROFILES = []


def post_worker_init(worker):
    local = threading.local()
    handle = type(worker).handle

    def profiled_handle(self, conn):
        if getattr(local, "profile", None) is None:
            local.profile = cProfile.Profile(time.thread_time)
            _PROFILES.append(local.profile)
            local.profile.enable()
        return handle(self, conn)

    type(worker).handle = profiled_handle
    main = cProfile.Profile(time.thread_time)
    _PROFILES.append(main)
    main.enable()


def worker_exit(server, worker):
    shipped_worker_exit(server, worker)
    for n, profile in enumerate(_PROFILES):
        profile.dump_stats(os.path.join(OUT, f"worker-{os.getpid()}-{n}.prof"))
'''


def part(path: str, name: str) -> str:
    """Return where a profiled function's code lives: a package, a ledger module, a call."""
    if path == "~":
        return name  # a built-in: socket calls, hashing, ...
    for marker in ("site-packages/", "lib/python3."):
        if marker in path:
            rest = path.split(marker, 1)[1]
            if marker == "lib/python3.":
                rest = rest.split("/", 1)[-1]
            top = rest.split("/")[0]
            return "/".join(rest.split("/")[:3]) if top == "gunicorn" else top.removesuffix(".py")
    if "/ledger/" in path:
        return "ledger/" + path.split("/ledger/", 1)[1]
    return path


def measure(e: benv.BenchEnv, seconds: float) -> dict[str, Any]:
    """Serve, load and profile; return the requests served and the shares by part."""
    url = e.migrated_pg("served_profile")
    public_id = ours_app(e, url)
    out = e.tmp / "profiles"
    out.mkdir()
    conf = e.tmp / "profiled_gunicorn_conf.py"
    conf.write_text(f"OUT = {str(out)!r}\n" + HOOKS)
    port = benv.free_port()
    env = e.app_env(url) | {"LEDGER_BIND": f"127.0.0.1:{port}"}
    command = [str(benv.BIN / "gunicorn"), "-c", str(conf), "app:create_app()"]
    with benv.serve(command, env, cwd=benv.ROOT, log=e.tmp / "served.log",
                    port=port) as (base, process):
        target = Target(base, url, f"/hooks/{public_id}", process.pid)
        load_run(target, signed_files(e.tmp, "warm", public_id, 2), 2)
        run = load_run(target, signed_files(e.tmp, "load", public_id, seconds), seconds)
    stats: pstats.Stats | None = None
    for file in sorted(glob.glob(str(out / "worker-*.prof"))):
        if stats is None:
            stats = pstats.Stats(file)
        else:
            stats.add(file)
    if stats is None:
        raise RuntimeError(f"the worker wrote no profile (see {e.tmp / 'served.log'})")
    return {"requests": run.wrk.requests, "accepted": run.accepted,
            "share": shares(stats, part, top=40)}


def main() -> None:
    """Run the served profile and print the largest shares."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()
    benv.run_alone("served_profile", lambda e: measure(e, args.seconds))


if __name__ == "__main__":
    main()
