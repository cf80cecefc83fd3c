"""Slow senders (finding 4) against the shipped server (gunicorn with gunicorn.conf.py, over
loopback): 60 sockets trickling their headers and 60 trickling their bodies do not keep
/healthz or a signed delivery waiting, and each slow socket is answered 408 and closed."""

from __future__ import annotations

import contextlib
import socket
import threading

import requests

from tests.helpers import ledger_counts, make_sender, signed_headers, trickling
from tests.servers import gunicorn_server, thread_server

SLOW_HEADERS = 60
SLOW_BODIES = 60
DEADLINE = 3.0  # LEDGER_BODY_READ_TIMEOUT_SECONDS here
ANSWER_WITHIN = 2.0  # the client gives up after this: no answer in time fails the test


class Trickler:
    """A socket that sends a request a few bytes at a time and reads whatever comes back."""

    def __init__(self, base_url: str, first: bytes, drip: bytes) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.sendall(first)
        self.drip = drip
        self.reply = b""
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while chunk := self.sock.recv(4096):
                self.reply += chunk
        self.closed.set()

    def trickle(self) -> None:
        """Send the next few bytes (the server may have hung up already)."""
        if not self.closed.is_set():
            with contextlib.suppress(OSError):
                self.sock.sendall(self.drip)


def _slow_clients(base_url: str, path: str, headers: dict[str, str]) -> list[Trickler]:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    slow_head = [Trickler(base_url, f"POST {path} HTTP/1.1\r\n".encode(), b"X-Pad: 1\r\n")
                 for _ in range(SLOW_HEADERS)]
    slow_body = [Trickler(base_url, f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}"
                                    "Content-Length: 1000\r\n\r\n{".encode(), b" ")
                 for _ in range(SLOW_BODIES)]
    return slow_head + slow_body


def _answers_meanwhile(base_url: str, sender, path: str) -> None:  # type: ignore[no-untyped-def]
    """/healthz and a signed delivery answer within ANSWER_WITHIN, three times over."""
    body = b'{"id": "evt_fast_%d", "type": "demo.credit", "data": {"amount": 1}}'
    assert requests.get(f"{base_url}/healthz", timeout=30).status_code == 200
    for n in range(3):  # while every slow socket is connected and trickling
        assert requests.get(f"{base_url}/healthz", timeout=ANSWER_WITHIN).status_code == 200
        fast = body % n
        answer = requests.post(f"{base_url}{path}", data=fast, timeout=ANSWER_WITHIN,
                               headers=signed_headers(sender, fast, f"evt_fast_{n}"))
        assert answer.status_code == 202, answer.text


def served_while_slow_clients_get_408(base_url: str, sender, path: str) -> None:  # type: ignore[no-untyped-def]
    """Hold the slow clients open while others are answered; the deadline ends each with 408."""
    clients = _slow_clients(base_url, path, signed_headers(sender, b"{}", "evt_slow"))
    with trickling(clients, every=0.5):
        _answers_meanwhile(base_url, sender, path)
        for client in clients:  # the deadline closes every one of them
            assert client.closed.wait(timeout=DEADLINE + 15)
    assert all(c.reply.startswith(b"HTTP/1.1 408") for c in clients), \
        sorted({c.reply[:30] for c in clients})


def test_slow_heads_and_bodies_hold_no_thread(app, test_env) -> None:  # type: ignore[no-untyped-def]
    """The Procfile's web line and the systemd unit: gunicorn with gunicorn.conf.py."""
    sender = make_sender(app)
    env = {**test_env, "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE),
           "LEDGER_LOG_LEVEL": "WARNING"}
    path = f"/hooks/{sender.public_id}"
    with gunicorn_server(env, workers=2) as (base_url, _process):
        served_while_slow_clients_get_408(base_url, sender, path)
    assert ledger_counts(app)["receipts"] == 3


def test_the_development_server_keeps_answering_too(test_env) -> None:  # type: ignore[no-untyped-def]
    """`make run` (`ledger dev`): werkzeug's threaded server, a thread per connection."""
    from app import create_app

    app = create_app({**test_env, "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE)})
    try:
        sender = make_sender(app)
        path = f"/hooks/{sender.public_id}"
        with thread_server(app) as base_url:
            clients = _slow_clients(base_url, path, signed_headers(sender, b"{}", "evt_s"))
            with trickling(clients, every=0.5):
                _answers_meanwhile(base_url, sender, path)
        assert ledger_counts(app)["receipts"] == 3
    finally:
        app.extensions["ledger"].close()
