"""The ledger's app behind granian's RSGI interface (bench/granian_rsgi.py, measured, not
shipped), on both databases: the CONTRACT's answers as the shipped server gives them, slow
heads and bodies ended while other senders are served, a declared or streamed body past
the largest limit refused unread; and what it does not hold: a delivery waiting on the
database holds its process."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench import granian_rsgi
from tests.helpers import event_body, ledger_counts, make_sender, signed_headers, trickling
from tests.integration.intake_answers import accepted_count, check_claim_answers, post
from tests.integration.test_slow_headers import (
    DEADLINE,
    SLOW_HEADERS,
    _answers_meanwhile,
    _slow_clients,
)
from tests.servers import granian_rsgi_server, gunicorn_server

WORKERS = 2


def _env(test_env: dict[str, str]) -> dict[str, str]:
    return {**test_env, "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE),
            "LEDGER_LOG_LEVEL": "WARNING"}


def test_the_contracts_answers(app, test_env) -> None:  # type: ignore[no-untyped-def]
    """202, a duplicate with its recorded outcome, 409, 413 by the integration's limit,
    a chunked delivery, and the dashboard's pages behind the same server."""
    sender = make_sender(app)
    small = make_sender(app, name="small", max_body_bytes=200)
    with granian_rsgi_server(_env(test_env), workers=WORKERS) as (base, _process):
        check_claim_answers(app, base, sender)
        refused = post(base, small, "evt_2", event_body(small, "evt_2", data={"p": "x" * 500}))
        assert (refused.status_code, refused.json()) == (413, {"error": "body_too_large"})
        chunked_body = event_body(sender, "evt_3")
        chunked = requests.post(f"{base}/hooks/{sender.public_id}", timeout=30,
                                data=iter([chunked_body[:10], chunked_body[10:]]),
                                headers=signed_headers(sender, chunked_body, "evt_3"))
        assert chunked.status_code == 202, chunked.text
        assert requests.get(f"{base}/healthz", timeout=30).status_code == 200
        assert requests.get(f"{base}/login", timeout=30).status_code == 200
    assert ledger_counts(app) == {"receipts": 2, "jobs": 2, "conflicts": 1}


def test_slow_heads_and_bodies_end_while_others_are_served(app, test_env) -> None:  # type: ignore[no-untyped-def]
    """test_slow_headers' slow sockets, against the adapter: none holds a process, and the
    deadline ends each; a slow body is answered 408, a slow head closed (granian's own
    head deadline closes without an answer, where the shipped server answers 408)."""
    sender = make_sender(app)
    path = f"/hooks/{sender.public_id}"
    with granian_rsgi_server(_env(test_env), workers=WORKERS) as (base, _process):
        clients = _slow_clients(base, path, signed_headers(sender, b"{}", "evt_slow"))
        with trickling(clients, every=0.5):
            _answers_meanwhile(base, sender, path)
            for client in clients:
                assert client.closed.wait(timeout=DEADLINE + 15)
    heads, bodies = clients[:SLOW_HEADERS], clients[SLOW_HEADERS:]
    assert all(c.reply == b"" for c in heads), sorted({c.reply[:30] for c in heads})
    assert all(c.reply.startswith(b"HTTP/1.1 408") for c in bodies), \
        sorted({c.reply[:30] for c in bodies})
    assert ledger_counts(app)["receipts"] == 3


def _exchange(base: str, head: bytes, then: bytes = b"") -> bytes:
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=10) as s:
        s.sendall(head + then)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def test_a_body_past_the_largest_limit_is_refused_unread(app, test_env) -> None:  # type: ignore[no-untyped-def]
    """Declared past MAX_BODY_BYTES: 413 and closed with the body unsent; streamed past
    it: 413 once the count passes it. Nothing is written."""
    sender = make_sender(app)
    path = f"/hooks/{sender.public_id}"
    with granian_rsgi_server(_env(test_env), workers=1) as (base, _process):
        declared = _exchange(base, (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                    f"{granian_rsgi.MAX_BODY_BYTES + 1}\r\n\r\n").encode())
        assert declared.startswith(b"HTTP/1.1 413"), declared[:40]
        assert b"body_too_large" in declared
        chunk = b"x" * (1024 * 1024)
        size = f"{len(chunk):x}\r\n".encode()
        streamed = _exchange(
            base, f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            .encode(), (size + chunk + b"\r\n") * 65)
        assert streamed.startswith(b"HTTP/1.1 413"), streamed[:40]
        assert requests.get(f"{base}/healthz", timeout=30).status_code == 200
    assert ledger_counts(app)["receipts"] == 0


@contextlib.contextmanager
def _writes_held(app: Any, url: str) -> Iterator[None]:
    """Hold the receipts' write lock: every claim waits on it until the block ends."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(make_url(url).database or "", isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return
    with app.extensions["ledger"].engine.begin() as held:
        held.execute(text("LOCK TABLE receipts IN ACCESS EXCLUSIVE MODE"))
        yield


def _until_waiting(app: Any, url: str) -> None:
    """Return once the held delivery's claim waits on the lock (on SQLite, after a while)."""
    if url.startswith("sqlite"):
        time.sleep(1.0)  # SQLite's busy wait is not visible from outside
        return
    query = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                 " AND wait_event_type = 'Lock' AND query ILIKE '%receipts%'")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with app.extensions["ledger"].engine.connect() as conn:
            if conn.execute(query).scalar():
                return
        time.sleep(0.05)
    raise AssertionError("the held delivery never waited on the lock")


@pytest.mark.parametrize("server", ["shipped", "rsgi"])
def test_a_delivery_waiting_on_the_database_holds_an_rsgi_process(  # type: ignore[no-untyped-def]
        app, test_env, server: str) -> None:
    """One process each: while a delivery waits on a held lock, the shipped server's other
    thread answers /healthz; the RSGI adapter's process answers nothing until it is done."""
    sender = make_sender(app)
    # The lock is held past PostgreSQL's default lock_timeout (2 s, then 503): wait it out.
    env = {**_env(test_env), "LEDGER_WEB_THREADS": "2", "LEDGER_DB_LOCK_TIMEOUT_MS": "10000"}
    serve = (granian_rsgi_server(env, workers=1) if server == "rsgi"
             else gunicorn_server(env, workers=1))
    with serve as (base, _process), ThreadPoolExecutor(max_workers=1) as pool:
        assert post(base, sender, "evt_warm", event_body(sender, "evt_warm")).status_code == 202
        with _writes_held(app, test_env["DATABASE_URL"]):
            held = pool.submit(post, base, sender, "evt_held", event_body(sender, "evt_held"))
            _until_waiting(app, test_env["DATABASE_URL"])
            try:
                healthz = requests.get(f"{base}/healthz", timeout=1.5).status_code
            except requests.Timeout:
                healthz = None
            assert not held.done()
        assert held.result(timeout=30).status_code == 202
    assert healthz == (None if server == "rsgi" else 200)
    assert ledger_counts(app)["receipts"] == 2


def test_metrics_sum_every_process(app, test_env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With a shared PROMETHEUS_MULTIPROC_DIR, /metrics counts the deliveries every worker
    accepted. (No clean-stop check: granian left a worker running after SIGTERM in about
    one stop of five; the server helper kills what is left.)"""
    sender = make_sender(app)
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = {**_env(test_env), "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    sent = 0
    with granian_rsgi_server(env, workers=WORKERS) as (base, _process):
        # New connections until every worker has counted some (a counter file each): the
        # kernel spreads connections over the workers, unevenly on a busy machine.
        while len(list(metrics.glob("counter_*.db"))) < WORKERS and sent < 200:
            with requests.Session() as session:
                body = event_body(sender, f"evt_m{sent}")
                answer = session.post(f"{base}/hooks/{sender.public_id}", data=body,
                                      headers=signed_headers(sender, body, f"evt_m{sent}"),
                                      timeout=30)
            assert answer.status_code == 202
            sent += 1
        assert len(list(metrics.glob("counter_*.db"))) == WORKERS
        assert accepted_count(base) == sent
    assert ledger_counts(app)["receipts"] == sent
