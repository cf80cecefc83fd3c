"""What a web server does with hostile or slow requests, over raw sockets.

    python -m bench.server_checks gunicorn   # the ledger under gunicorn.conf.py's limits
    python -m bench.server_checks uwsgi      # under uWSGI (bench/servers.py flags; pyuwsgi)

One process x 4 threads on a fresh SQLite ledger with the bench integration, body
deadline 1 s. Prints the first line of each answer (or what the connection did):
a valid signed event sent chunked, a malformed chunked body, 100 header fields, a
5,000-byte request line, a 9,000-byte header, and a body trickled a byte per 0.2 s.
The figures are in bench/README.md, "Web server".
"""

from __future__ import annotations

import random
import shutil
import socket
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import env as benv
from bench import servers
from bench.intake import ours_app
from bench.loadgen import body_for, raw_request

CRLF = b"\r\n"


def exchange(base: str, data: bytes, trickle: bytes = b"", timeout: float = 15) -> str:
    """Send `data` (then `trickle` a byte per 0.2 s); describe the answer."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        started = time.monotonic()
        for byte in trickle:
            try:
                sock.sendall(bytes([byte]))
            except OSError as error:
                return f"send failed after {time.monotonic() - started:.1f} s: {error}"
            time.sleep(0.2)
            sock.setblocking(False)
            try:
                got = sock.recv(65536)
            except BlockingIOError:
                got = b""
            sock.setblocking(True)
            if got:
                return f"{got.split(CRLF, 1)[0]!r} after {time.monotonic() - started:.1f} s"
        answer = b""
        try:
            while CRLF + CRLF not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except OSError as error:
            return f"{type(error).__name__} after {time.monotonic() - started:.1f} s"
        if not answer:
            return f"closed without an answer after {time.monotonic() - started:.1f} s"
        return f"{answer.split(CRLF, 1)[0]!r} after {time.monotonic() - started:.1f} s"


def checks(base: str, public_id: str) -> dict[str, str]:
    """Run every request against `base`; return what each got."""
    host = urlsplit(base).netloc
    rng = random.Random(1)
    signed = raw_request(f"/hooks/{public_id}", benv.SECRET, "evt_chunked1",
                         body_for("evt_chunked1", rng), int(time.time()))
    head, _, body = signed.partition(CRLF + CRLF)
    head = CRLF.join(line for line in head.split(CRLF)
                     if not line.lower().startswith(b"content-length"))
    chunked = (head + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + f"{len(body):x}\r\n".encode()
               + body + b"\r\n0\r\n\r\n")
    bad = (head.replace(b"evt_chunked1", b"evt_chunked2")
           + b'\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\nzz\r\nnot a chunk\r\n0\r\n\r\n')
    many = (f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n".encode()
            + b"".join(f"X-H{i}: v\r\n".encode() for i in range(100)) + CRLF)
    line = f"GET /healthz?{'a' * 5000} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    big = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Big: {'a' * 9000}\r\n\r\n".encode()
    slow = (head.replace(b"evt_chunked1", b"evt_slow")
            + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    return {"a valid signed event, chunked": exchange(base, chunked),
            "a malformed chunked body": exchange(base, bad),
            "100 header fields": exchange(base, many),
            "a 5,000-byte request line": exchange(base, line),
            "a 9,000-byte header": exchange(base, big),
            "a body trickled 1 byte / 0.2 s (deadline 1 s)": exchange(base, slow, body[:30])}


def main(which: str) -> None:
    """Serve the ledger with `which`, run the checks, print them."""
    e = benv.BenchEnv(tmp=Path(tempfile.mkdtemp(prefix="ledger-bench-")))
    try:
        url = e.sqlite_url("checks")
        public_id = ours_app(e, url)
        env = e.app_env(url) | {"LEDGER_BODY_READ_TIMEOUT_SECONDS": "1"}
        shape = benv.ServerShape(workers=1, threads=4)
        server: AbstractContextManager[tuple[str, Any]] = (
            servers.uwsgi(env, shape, log=e.tmp / "server.log") if which == "uwsgi" else
            benv.gunicorn("app:create_app()", env, shape, cwd=benv.ROOT,
                          log=e.tmp / "server.log"))
        with server as (base, _):
            for name, got in checks(base, public_id).items():
                print(f"{which}: {name}: {got}")
    finally:
        e.drop_all()
        shutil.rmtree(e.tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gunicorn")
