"""Load: pre-signed Standard Webhooks deliveries replayed by wrk (bench/README.md, "Load").

Signing in wrk's Lua would need an HMAC in Lua; instead Python signs every
request up front (timestamps stay valid: the bench integration's tolerance is a
day) and wrk, a C load generator, replays the raw bytes through bench/replay.lua.
The load generator then costs little CPU on this 2-core machine.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ledger.ids import BASE62

LUA = Path(__file__).with_name("replay.lua")
FILLER_WORDS = ("invoice", "customer", "amount", "currency", "status", "metadata", "line")


@dataclass(frozen=True, slots=True, kw_only=True)
class WrkResult:
    """What one wrk run did, with latency in milliseconds."""

    requests: int
    seconds: float
    errors: int
    status_errors: int
    p50_ms: float
    p99_ms: float
    wraps: int
    sent_per_thread: str

    @property
    def per_second(self) -> float:
        """Return requests per second over the run."""
        return self.requests / self.seconds if self.seconds else 0.0


def body_for(event_id: str, rng: random.Random, size: int = 1024) -> bytes:
    """Return a ~`size`-byte Stripe-like demo.credit event."""
    meta = {f"{rng.choice(FILLER_WORDS)}_{k}": "".join(rng.choices(BASE62, k=24))
            for k in range(size // 40)}
    doc = {"type": "demo.credit", "id": event_id, "object": "event",
           "data": {"amount": 1, "currency": "eur", "metadata": meta}}
    return json.dumps(doc, separators=(",", ":")).encode()


def raw_request(path: str, secret: str, event_id: str, body: bytes, timestamp: int) -> bytes:
    """Return one raw HTTP/1.1 request signed the Standard Webhooks way."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{event_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.digest(key, signed, hashlib.sha256)).decode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nwebhook-id: {event_id}\r\n"
            f"webhook-timestamp: {timestamp}\r\nwebhook-signature: v1,{signature}\r\n\r\n")
    return head.encode() + body


def stripe_request(path: str, secret: str, event_id: str, body: bytes, timestamp: int) -> bytes:
    """Return one raw HTTP/1.1 request signed the Stripe way: `Stripe-Signature: t=…,v1=…`,
    HMAC-SHA256 hex of `{t}.{body}` under the whole `whsec_…` string (the id is the body's)."""
    signed = f"{timestamp}.".encode() + body
    signature = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nStripe-Signature: t={timestamp},v1={signature}"
            "\r\n\r\n")
    return head.encode() + body


def presign(prefix: Path, *, path: str, secret: str, per_thread: int, threads: int,
            tag: str, seed: int = 8,
            sign: Callable[[str, str, str, bytes, int], bytes] = raw_request) -> None:
    """Write `threads` files of `per_thread` deliveries with fresh event ids, each signed by
    `sign` (Standard Webhooks by default)."""
    rng = random.Random(f"{seed}:{tag}")
    now = int(time.time())
    for thread in range(threads):
        with open(f"{prefix}.{thread}", "wb") as out:
            for _ in range(per_thread):
                event_id = "evt_" + "".join(rng.choices(BASE62, k=24))
                request = sign(path, secret, event_id, body_for(event_id, rng), now)
                out.write(f"{len(request)}\n".encode() + request)


def wrk_binary() -> str:
    """Return the wrk executable; install Debian's package when root, else explain."""
    found = shutil.which("wrk")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for step in (["apt-get", "update", "-qq"],
                     ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "wrk"]):
            subprocess.run(step, env=env, check=False, capture_output=True, timeout=600)
        found = shutil.which("wrk")
    if found is None:
        raise SystemExit("wrk is missing: `apt-get install -y wrk` (Debian), then `make bench`")
    return found


def run_wrk(base_url: str, prefix: Path, *, seconds: float, connections: int = 16,
            threads: int = 2, limits: str | None = None) -> WrkResult:
    """Replay the files under `prefix` against `base_url`; return wrk's summary."""
    duration = f"{max(1, round(seconds))}s"  # wrk takes whole seconds only
    args = [wrk_binary(), "-t", str(threads), "-c", str(connections), "-d", duration,
            "--timeout", "10s", "-s", str(LUA), base_url, "--", str(prefix)]
    if limits:
        args.append(limits)
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60,
                          check=True)
    line = next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{"))
    raw = json.loads(line)
    errors = raw["connect_errors"] + raw["read_errors"] + raw["write_errors"] + raw["timeouts"]
    return WrkResult(requests=raw["requests"], seconds=raw["duration_us"] / 1e6,
                     errors=errors, status_errors=raw["status_errors"],
                     p50_ms=raw["p50_us"] / 1000, p99_ms=raw["p99_us"] / 1000,
                     wraps=raw["wraps"], sent_per_thread=raw["sent_per_thread"])
