"""Slow senders (issue 14, finding 4): a trickled body gets 408 and frees its thread.

Over real HTTP against the production server (gunicorn with gunicorn.conf.py,
several processes): 30 sockets send their headers and then trickle the body a
byte at a time, often enough that no single recv() ever waits long. The service
must keep answering others, and each slow sender must get 408 once its deadline
(LEDGER_BODY_READ_TIMEOUT_SECONDS, 1 s here) has passed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from ledger.config import WebServerSettings
from ledger.web.buffering_worker import BUFFER_BODY_BYTES
from tests.helpers import ledger_counts, make_sender, signed_headers, trickling
from tests.servers import gunicorn_server, thread_server

SLOW_SENDERS = 30
DEADLINE = 1.0
DECLARED = 1000  # bytes announced by each slow sender, never all sent


class SlowSender:
    """A socket that sent its headers and trickles its body; a thread reads the answer."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str], *,
                 declared: int = DECLARED) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        # Before the send: the server's deadline starts once it has the headers, which
        # can be before sendall returns here (a wait read as 0.9996 s for a 1 s deadline).
        self.started = time.monotonic()
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}"
                          f"Content-Length: {declared}\r\n\r\n{{".encode())
        self.reply = b""
        self.answered_after: float | None = None
        self._reader = threading.Thread(target=self._read_reply, daemon=True)
        self._reader.start()

    def trickle(self) -> None:
        """Send one more byte of the body (the server may have hung up already)."""
        if self.answered_after is None:
            with contextlib.suppress(OSError):
                self.sock.sendall(b" ")

    def _read_reply(self) -> None:
        """Read the answer until the server closes; note when its first byte came."""
        while chunk := self._recv():
            if not self.reply:
                self.answered_after = time.monotonic() - self.started
            self.reply += chunk

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(4096)
        except OSError:  # reset after the answer: the unread rest of the body
            return b""

    def wait_reply(self) -> str:
        """Return the whole answer once the server has closed the connection."""
        self._reader.join(timeout=30)
        self.sock.close()
        return self.reply.decode(errors="replace")


def _deliver(base_url: str, path: str, sender, event_id: str):  # type: ignore[no-untyped-def]
    """POST one signed new event; return the answer and how long it took."""
    body = json.dumps({"id": event_id, "type": "demo.credit", "data": {"amount": 1}}).encode()
    started = time.monotonic()
    answer = requests.post(f"{base_url}{path}", data=body, timeout=10,
                           headers=signed_headers(sender, body, event_id))
    return answer, time.monotonic() - started


def test_slow_senders_get_408_while_the_service_keeps_answering(app, test_env):
    sender = make_sender(app)
    env = {**test_env, "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE)}
    path = f"/hooks/{sender.public_id}"
    with gunicorn_server(env, workers=2) as (base_url, _process):
        slow = [SlowSender(base_url, path, signed_headers(sender, b"{}", f"evt_slow{i}"))
                for i in range(SLOW_SENDERS)]
        with trickling(slow, every=0.2):
            time.sleep(0.3)  # every slow request is in the server by now
            started = time.monotonic()
            health = requests.get(f"{base_url}/healthz", timeout=10)
            health_seconds = time.monotonic() - started
            delivery, delivery_seconds = _deliver(base_url, path, sender, "evt_fast")
            replies = [s.wait_reply() for s in slow]
    assert health.status_code == 200 and health_seconds < 2.5, health_seconds
    assert delivery.status_code == 202 and delivery_seconds < 2.5, delivery_seconds
    assert all(r.startswith("HTTP/1.1 408") and '"request_timeout"' in r for r in replies), \
        sorted({r[:40] for r in replies})
    waited = [s.answered_after for s in slow]
    assert all(w is not None and DEADLINE <= w < DEADLINE + 8 for w in waited), waited
    assert ledger_counts(app)["receipts"] == 1  # only the fast delivery


def test_slow_large_bodies_free_their_threads_at_the_deadline(app, test_env):
    """A body over the event loop's 1 MiB buffer is read by its thread: one process of the
    default threads, all but one held by senders trickling such bodies, still answers others,
    and each of those threads is free again at the body deadline."""
    sender = make_sender(app)
    threads = WebServerSettings.from_env(test_env).threads
    env = {**test_env, "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE),
           "LEDGER_MAX_BODY_BYTES": str(4 * BUFFER_BODY_BYTES)}
    path = f"/hooks/{sender.public_id}"
    with gunicorn_server(env, workers=1) as (base_url, _process):
        slow = [SlowSender(base_url, path, signed_headers(sender, b"{}", f"evt_large{i}"),
                           declared=2 * BUFFER_BODY_BYTES) for i in range(threads - 1)]
        with trickling(slow, every=0.2):
            time.sleep(0.3)  # every slow request holds its thread by now
            delivery, delivery_seconds = _deliver(base_url, path, sender, "evt_fast")
            replies = [s.wait_reply() for s in slow]
            # Afterwards the process answers as many deliveries at once as it has threads.
            with ThreadPoolExecutor(threads) as pool:
                after = [answer.status_code for answer, _ in pool.map(
                    lambda i: _deliver(base_url, path, sender, f"evt_after{i}"),
                    range(threads))]
    assert delivery.status_code == 202 and delivery_seconds < DEADLINE, delivery_seconds
    assert all(r.split("\r\n", 1)[0].split()[1:2] == ["408"] for r in replies), \
        sorted({r[:40] for r in replies})
    waited = [s.answered_after for s in slow]
    assert all(w is not None and DEADLINE <= w < DEADLINE + 8 for w in waited), waited
    assert after == [202] * threads
    assert ledger_counts(app)["receipts"] == 1 + threads  # no slow body was recorded


def test_a_slow_login_form_gets_408_too(test_env):
    """The deadline covers every route, not only the intake (werkzeug's server here)."""
    from app import create_app

    app = create_app({**test_env, "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE)})
    try:
        with thread_server(app) as base_url:
            slow = SlowSender(base_url, "/login",
                              {"Content-Type": "application/x-www-form-urlencoded"})
            with trickling([slow], every=0.2):
                reply = slow.wait_reply()
    finally:
        app.extensions["ledger"].close()
    assert reply.split("\r\n", 1)[0].split()[1] == "408", reply[:80]
    assert slow.answered_after is not None and slow.answered_after >= DEADLINE
