"""Where the ledger's web CPU per delivery goes, by part: an in-process profile of the intake.

    .venv/bin/python -m bench.intake_profile [--requests 3000]

Builds the app on a fresh PostgreSQL ledger, sends `--requests` signed new events straight
to its WSGI callable (no HTTP server: what the web processes' Python spends around the
claim), profiled by CPU time (cProfile with `time.process_time`), and sums each function's
own time into the parts the ledger adds to the floor. Profiling slows every call, so read
the shares, not the absolute figures. Before the profile, the same number of deliveries
is timed unprofiled on the ledger's callable and on the floor's (bench/floor_intake.py, on
a database of its own), in alternating rounds: the CPU per delivery each app costs before
any server serves it. Writes bench/results/intake_profile.json.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import hashlib
import hmac
import io
import json
import os
import pstats
import time
import uuid
from collections import Counter
from collections.abc import Callable
from statistics import median
from typing import Any

from bench import env as benv
from bench import floor_intake, thin_intake
from bench.intake import ours_app, thin_env
from bench.schemas import create_thin_pg

# First match wins: a function's file path (or name) -> the part it belongs to.
PARTS = (("structlog", "request log line"), ("logging/", "request log line"),
         ("ledger/logs.py", "request log line"), ("prometheus_client", "metrics"),
         ("heartbeat", "heartbeat"), ("delivery_log", "delivery log"),
         ("credential_view", "credential view"), ("sqlalchemy/", "pool checkout and return"),
         ("psycopg", "driver (psycopg)"), ("json/decoder", "JSON validation"),
         ("json/encoder", "response building"), ("signatures", "signature check"),
         ("hmac", "signature check"), ("werkzeug", "WSGI input"),
         ("ledger/", "the rest of the ledger"))


def _environ(public_id: str, key: bytes) -> dict[str, Any]:
    """Return a WSGI environ of one new signed Standard Webhooks delivery."""
    body = json.dumps({"type": "demo.credit", "data": {"amount": 1, "account": "a"}}).encode()
    event_id, stamp = f"evt_{uuid.uuid4().hex}", str(int(time.time()))
    signature = base64.b64encode(hmac.new(key, f"{event_id}.{stamp}.".encode() + body,
                                          hashlib.sha256).digest()).decode()
    return {"REQUEST_METHOD": "POST", "PATH_INFO": f"/hooks/{public_id}", "SCRIPT_NAME": "",
            "QUERY_STRING": "", "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)), "SERVER_NAME": "bench", "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
            "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http",
            "HTTP_WEBHOOK_ID": event_id, "HTTP_WEBHOOK_TIMESTAMP": stamp,
            "HTTP_WEBHOOK_SIGNATURE": f"v1,{signature}"}


def _part(path: str, name: str) -> str:
    where = f"{path}:{name}"
    return next((part for needle, part in PARTS if needle in where), "Python and the rest")


def measure(e: benv.BenchEnv, requests: int) -> dict[str, Any]:
    """Profile `requests` deliveries; return CPU ms per delivery in all and by part."""
    url = e.migrated_pg("profile")
    public_id = ours_app(e, url)
    os.environ.update(e.app_env(url))
    from app import create_app

    app = create_app()
    key = base64.b64decode(benv.SECRET.removeprefix("whsec_"))

    def start_response(_status: str, _headers: list[tuple[str, str]],
                       _exc_info: Any = None) -> Callable[[bytes], object]:
        return len

    try:
        for _ in range(200):  # warm: pool filled, statements prepared
            b"".join(app.wsgi_app(_environ(public_id, key), start_response))
        unprofiled = _apps_unprofiled(e, app.wsgi_app, start_response, public_id, key,
                                      requests)
        environs = [_environ(public_id, key) for _ in range(requests)]
        profile = cProfile.Profile(time.process_time)
        started = time.process_time()
        profile.enable()
        for environ in environs:
            b"".join(app.wsgi_app(environ, start_response))
        profile.disable()
        spent = time.process_time() - started
    finally:
        app.extensions["ledger"].close()
    return {"requests": requests, "cpu_ms_per_delivery_profiled": 1000 * spent / requests,
            **unprofiled, "share": shares(pstats.Stats(profile), _part)}


def _apps_unprofiled(e: benv.BenchEnv, ledger_app: Callable[..., Any],
                     start_response: Callable[..., Any], public_id: str, key: bytes,
                     requests: int, rounds: int = 5) -> dict[str, Any]:
    """Return the median CPU µs per delivery of the ledger's app and the floor's, unprofiled."""
    floor_url = e.pg_url("profile_floor")
    create_thin_pg(floor_url)
    # The floor reads its database and key from the environment at import: set them here.
    floor_intake.URL = thin_env(floor_url)["THIN_DATABASE_URL"]
    thin_intake.KEY = key
    apps = {"ledger": ledger_app, "floor": floor_intake.app}
    spent: dict[str, list[float]] = {name: [] for name in apps}
    statuses: Counter[str] = Counter()

    def counted(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        statuses[status.split(" ", 1)[0]] += 1
        return start_response(status, headers, exc_info)

    try:
        for _ in range(200):  # the floor's thread connection opened, its statement prepared
            b"".join(floor_intake.app(_environ(public_id, key), counted))
        for n in range(rounds):
            for name in sorted(apps, reverse=n % 2 == 1):  # alternating order
                environs = [_environ(public_id, key) for _ in range(requests)]
                started = time.process_time()
                for environ in environs:
                    b"".join(apps[name](environ, counted))
                spent[name].append(1e6 * (time.process_time() - started) / requests)
        if set(statuses) != {"202"}:  # each app accepted every new event, or nothing counts
            raise RuntimeError(f"the apps answered {dict(statuses)}, not only 202")
    finally:
        connection = getattr(floor_intake.LOCAL, "conn", None)
        if connection is not None:
            connection.close()
            floor_intake.LOCAL.conn = None
    return {"ledger_app_us": median(spent["ledger"]), "floor_app_us": median(spent["floor"]),
            "app_us_per_round": {name: [round(us, 1) for us in runs]
                                 for name, runs in spent.items()}}


def shares(stats: pstats.Stats, part_of: Callable[[str, str], str],
           top: int | None = None) -> dict[str, float]:
    """Return each part's share of the profiled functions' own time, largest first."""
    parts: Counter[str] = Counter()
    profiled: Any = stats
    for (path, _line, name), (_cc, _nc, own, _cum, _callers) in profiled.stats.items():
        parts[part_of(path, name)] += own
    total = sum(parts.values())
    return {part: round(own / total, 3) for part, own in parts.most_common(top)}


def main() -> None:
    """Run the profile and print the shares by part."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    benv.run_alone("intake_profile", lambda e: measure(e, args.requests))


if __name__ == "__main__":
    main()
