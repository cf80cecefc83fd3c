"""Where the ledger's web CPU per delivery goes, by part: an in-process profile of the intake.

    .venv/bin/python -m bench.intake_profile [--requests 3000]

Builds the app on a fresh PostgreSQL ledger, sends `--requests` signed new events straight
to its WSGI callable (no HTTP server: what the web processes' Python spends around the
claim), profiled by CPU time (cProfile with `time.process_time`), and sums each function's
own time into the parts the ledger adds to the floor. Profiling slows every call, so read
the shares, not the absolute figures. Writes bench/results/intake_profile.json.
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
from typing import Any

from bench import env as benv
from bench.intake import ours_app

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
            "share": shares(pstats.Stats(profile), _part)}


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
