"""Where the rest goes: the two ceilings the intake's accepted/s is a share of.

Both are measured in the same run as the intake (issue 15, "where the rest goes"):

1. PostgreSQL's own two-insert ceiling: pgbench (C, no HTTP, no Python), as many
   clients as wrk has connections, runs the thin intake's transaction on the thin
   schema: INSERT the receipt ON CONFLICT DO NOTHING, INSERT the job with a ~1 KB
   payload, COMMIT (fsync on, the server's settings as they are).
2. The server's HMAC-only ceiling: bench/hmac_only.py (read the body, check the
   HMAC, parse the JSON, answer 202; no database) under the same gunicorn shape,
   loaded by wrk with the same kind of pre-signed requests. Its CPU per request
   (bench/cpu.py) is the least any intake served by gunicorn and Flask spends.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from bench import cpu
from bench import env as benv
from bench.intake import CONNECTIONS, THREADS, signed_files
from bench.loadgen import run_wrk
from bench.schemas import create_thin_pg

TWO_INSERTS = """\
BEGIN;
INSERT INTO receipts (accepted_at, scope_id, state, attempts, event_id, event_type, body_sha256)
 VALUES (now(), 1, 0, 0, 'evt_' || gen_random_uuid(), 'demo.credit', '\\x00')
 ON CONFLICT DO NOTHING;
INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status, attempts,
 lease_token, payload) VALUES (1, 'evt_' || gen_random_uuid(), 'demo.credit', now(), now(), 0, 0,
 0, repeat('x', 1024));
COMMIT;
"""


def pgbench_binary() -> str:
    """Return pgbench (PostgreSQL's client package ships it)."""
    found = shutil.which("pgbench") or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    if found is None:
        raise RuntimeError("pgbench is missing: `apt-get install -y postgresql-client`")
    return found


def postgres_two_inserts(e: benv.BenchEnv, seconds: float) -> dict[str, Any]:
    """Return pgbench's transactions/s of the two-insert transaction."""
    url = make_url(e.pg_url("ceiling"))
    create_thin_pg(url.render_as_string(hide_password=False))
    script = e.tmp / "two_inserts.sql"
    script.write_text(TWO_INSERTS)
    args = [pgbench_binary(), "-n", "-c", str(CONNECTIONS), "-j", str(THREADS),
            "-T", str(max(1, round(seconds))), "-f", str(script),
            "-h", url.host or "127.0.0.1", "-p", str(url.port or 5432),
            "-U", url.username or "postgres", str(url.database)]
    env = {"PGPASSWORD": url.password} if url.password else {}
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120,
                          check=True, env={**os.environ, **env})
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    if tps is None:
        raise RuntimeError(f"pgbench printed no tps: {done.stdout[-300:]}")
    return {"tps": float(tps.group(1)), "clients": CONNECTIONS, "seconds": seconds}


def hmac_only(e: benv.BenchEnv, shape: benv.ServerShape, public_id: str,
              seconds: float) -> dict[str, Any]:
    """Return the HMAC-only server's answered requests/s under wrk."""
    files = signed_files(e.tmp, "ceiling-hmac", public_id, seconds)
    warm = signed_files(e.tmp, "ceiling-hmac-warm", public_id, 2)
    with benv.gunicorn("bench.hmac_only:app", {"THIN_SECRET": benv.SECRET}, shape,
                       cwd=benv.ROOT, log=e.tmp / "hmac-only.log") as (base, server):
        run_wrk(f"{base}/hooks/{public_id}", warm, seconds=2)
        with cpu.measured(server.pid) as use:
            result = run_wrk(f"{base}/hooks/{public_id}", files, seconds=seconds)
    ok = result.requests - result.status_errors
    return {"answered_per_s": ok / result.seconds if result.seconds else 0.0,
            "requests": result.requests, "non_2xx": result.status_errors,
            "p99_ms": result.p99_ms, "seconds": round(result.seconds, 2),
            "cpu": use.per_request_ms(result.requests)}


def measure(e: benv.BenchEnv, shape: benv.ServerShape, public_id: str,
            seconds: float) -> dict[str, Any]:
    """Both ceilings, `seconds` each."""
    return {"postgres": postgres_two_inserts(e, seconds),
            "hmac_only": hmac_only(e, shape, public_id, seconds)}

