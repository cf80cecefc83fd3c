"""Forwarding to a real local HTTP service: signed request, outcomes, kept answers (CONTRACT 8).

The receiving service verifies each request with the `standardwebhooks` library, as a
platform team's service in any language would with its own.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import standardwebhooks
from sqlalchemy import select

from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.db.schema import destination_attempts, destinations
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.admission import admit, note_outcome
from ledger.destinations.forward import (
    DeliveryError,
    Forwarder,
    ForwardEvent,
    ForwardTarget,
    Outcome,
    retry_after_seconds,
)
from ledger.destinations.secrets import live_secrets, new_signing_secret
from ledger.destinations.store import DestinationSettings, create_destination, record_attempt
from ledger.handlers import PermanentFailure, RetryAfter
from tests.helpers import make_sender
from tests.receivers import Answer, receiving

BODY = b'{"id":"evt_1","type":"order.paid","data":{"amount":5}}'
EVENT = ForwardEvent(scope="acme/shop", event_id="evt_1", event_type="order.paid", attempt=1)
CAP = 600.0


@pytest.fixture
def forwarder():  # type: ignore[no-untyped-def]
    """A forwarder allowed to reach the loopback receivers (LEDGER_DESTINATION_ALLOW)."""
    sender = Forwarder(policy=AddressPolicy.from_entries(["127.0.0.1"]), retry_cap_seconds=CAP)
    yield sender
    sender.close()


def _target(url: str, *secrets: str, timeout: float = 5.0) -> ForwardTarget:
    return ForwardTarget(url=url, timeout_seconds=timeout,
                         secrets=list(secrets) or [new_signing_secret()])


def test_the_request_verifies_with_standard_webhooks_and_carries_the_key(forwarder):
    secret = new_signing_secret()
    with receiving() as (url, receiver):
        result = forwarder.forward(_target(url + "/hooks", secret), EVENT, BODY,
                                   "application/json; charset=utf-8")
    (got,) = receiver.requests
    assert (got.method, got.path, got.body) == ("POST", "/hooks", BODY)
    assert standardwebhooks.Webhook(secret).verify(got.body, got.headers)["id"] == "evt_1"
    key = "acme/shop:evt_1"
    assert got.headers["webhook-id"] == got.headers["idempotency-key"] == key
    assert got.headers["content-type"] == "application/json; charset=utf-8"
    assert (got.headers["x-ledger-scope"], got.headers["x-ledger-event-type"],
            got.headers["x-ledger-attempt"]) == ("acme/shop", "order.paid", "1")
    assert not {"stripe-signature", "svix-signature", "x-hub-signature-256"} & set(got.headers)
    assert (result.outcome, result.http_status, result.result_ref) == (Outcome.COMPLETE, 200,
                                                                       "http:200")
    assert result.result_ref_or_raise() == "http:200"
    assert result.response_excerpt == "ok" and result.latency_ms > 0


def test_both_secrets_sign_during_a_rotation(forwarder):
    old, new = new_signing_secret(), new_signing_secret()
    with receiving() as (url, receiver):
        forwarder.forward(_target(url, new, old), EVENT, BODY, "application/json")
    (got,) = receiver.requests
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        standardwebhooks.Webhook(secret).verify(got.body, got.headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_signing_secret()).verify(got.body, got.headers)


@pytest.mark.parametrize(("header", "expected"), [
    ("order-42", "order-42"), ("x" * 255, "x" * 255), ("x" * 256, "http:201"),
    ("caf\u00e9", "http:201")])
def test_x_result_ref_is_the_result_when_usable(forwarder, header, expected):
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=201, headers={"X-Result-Ref": header}))
        result = forwarder.forward(_target(url), EVENT, BODY, "application/json")
    assert result.result_ref == expected


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503])
def test_retryable_statuses_retry_with_the_workers_backoff(forwarder, status):
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=status, body=b"busy"))
        result = forwarder.forward(_target(url), EVENT, BODY, "application/json")
    assert (result.outcome, result.http_status, result.retry_after) == (Outcome.RETRY, status,
                                                                        None)
    with pytest.raises(DeliveryError):
        result.result_ref_or_raise()


def test_retry_after_is_honoured_in_seconds_or_as_a_date_and_capped(forwarder):
    now = datetime.now(UTC)
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=429, headers={"Retry-After": "30"}),
                        Answer(status=503, headers={"Retry-After": format_datetime(
                            now + timedelta(seconds=120), usegmt=True)}),
                        Answer(status=503, headers={"Retry-After": "86400"}))
        results = [forwarder.forward(_target(url), EVENT, BODY, "application/json", now=now)
                   for _ in range(3)]
    assert results[0].retry_after == 30
    assert 119 <= (results[1].retry_after or 0) <= 120
    assert results[2].retry_after == CAP
    with pytest.raises(RetryAfter) as raised:
        results[0].result_ref_or_raise()
    assert raised.value.seconds == 30


def test_retry_after_parsing_ignores_what_it_cannot_read():
    now = datetime.now(UTC)
    assert retry_after_seconds("soon", cap=CAP, now=now) is None
    assert retry_after_seconds("-5", cap=CAP, now=now) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", cap=CAP, now=now) == 0


def test_other_statuses_fail_at_once_keeping_the_first_kib(forwarder):
    answer = b'{"error":"unknown order"}' + b"x" * 5000
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=400, body=answer))
        result = forwarder.forward(_target(url), EVENT, BODY, "application/json")
    assert (result.outcome, result.http_status) == (Outcome.FAILED, 400)
    assert result.response_excerpt == answer[:1024].decode()
    with pytest.raises(PermanentFailure) as raised:
        result.result_ref_or_raise()
    assert "400" in raised.value.reason


def test_a_redirect_is_not_followed(forwarder):
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=307, headers={"Location": url + "/elsewhere"}))
        result = forwarder.forward(_target(url + "/hooks"), EVENT, BODY, "application/json")
    assert [r.path for r in receiver.requests] == ["/hooks"]
    assert (result.outcome, result.http_status) == (Outcome.FAILED, 307)


def test_a_slow_destination_times_out_and_is_retried(forwarder):
    with receiving() as (url, receiver):
        receiver.answer(Answer(hold=True))
        result = forwarder.forward(_target(url, timeout=0.3), EVENT, BODY, "application/json")
    assert (result.outcome, result.http_status) == (Outcome.RETRY, None)
    assert result.error is not None and result.error.startswith("timeout")


def test_an_answer_that_trickles_in_is_cut_at_the_total_deadline(forwarder):
    # Each byte arrives well within the read timeout: only the total deadline ends it.
    with receiving() as (url, receiver):
        receiver.answer(Answer(body=b"x" * 1000, drip_every=0.05))
        result = forwarder.forward(_target(url, timeout=0.5), EVENT, BODY, "application/json")
    assert (result.outcome, result.http_status) == (Outcome.RETRY, None)
    assert result.error is not None and result.error.startswith("timeout")


def test_a_refused_connection_is_retried(forwarder):
    with receiving() as (url, _receiver):
        closed = url  # the server stops at the end of the block: its port refuses
    result = forwarder.forward(_target(closed), EVENT, BODY, "application/json")
    assert (result.outcome, result.http_status) == (Outcome.RETRY, None)
    assert result.error is not None and result.error.startswith("connection")


def test_attempts_and_backoff_are_kept_on_the_ledger(app, forwarder):
    """500, 503, then 200: three attempts with one key; the answers stay with the receipt.

    Each attempt runs as the worker will: secrets read, the POST made with no transaction
    open, then the answer recorded in a short transaction of its own.
    """
    svc = app.extensions["ledger"]
    sender = make_sender(app, account="acme", name="shop")
    with svc.engine.begin() as conn:
        created = create_destination(
            conn, svc.box, audit.Actor(name="test", role="admin"),
            get_integration(conn, sender.public_id),
            DestinationSettings(url="http://127.0.0.1:9/", event_types=["order.paid"]),
            policy=AddressPolicy.from_entries(["127.0.0.1"]), handled_types=(),
            now=svc.clock.now())
    dst = created.destination
    with receiving() as (url, receiver):
        receiver.answer(Answer(status=500, body=b"oops"), Answer(status=503), Answer())
        for attempt in (1, 2, 3):
            now = svc.clock.now()
            with svc.engine.connect() as conn:
                secrets = live_secrets(conn, svc.box, dst.id, now=now)
            event = ForwardEvent(scope=sender.scope, event_id="evt_1",
                                 event_type="order.paid", attempt=attempt)
            result = forwarder.forward(ForwardTarget(url=url, timeout_seconds=5,
                                                     secrets=secrets), event, BODY,
                                       "application/json")
            with svc.engine.begin() as conn:
                record_attempt(conn, dst.id, scope_id=sender.scope_id, event_id="evt_1",
                               number=attempt, started_at=now, latency_ms=result.latency_ms,
                               http_status=result.http_status, outcome=result.outcome.value,
                               error=result.error, response_excerpt=result.response_excerpt)
                note_outcome(conn, dst.id, ok=result.outcome is Outcome.COMPLETE, now=now,
                             ceiling=10.0 * attempt)
                if attempt == 2:  # held: no worker may send until blocked_until
                    held = conn.execute(select(destinations)).one()
                    assert held.consecutive_failures == 2
                    assert held.blocked_until == now + timedelta(seconds=20)
                    assert admit(conn, dst.id, now=now).reason == "backoff"
                    assert admit(conn, dst.id, now=held.blocked_until).admitted
    with svc.engine.connect() as conn:
        rows = conn.execute(select(destination_attempts)
                            .order_by(destination_attempts.c.number)).all()
        after = conn.execute(select(destinations)).one()
    assert [(r.number, r.http_status, r.outcome) for r in rows] == [
        (1, 500, "retry"), (2, 503, "retry"), (3, 200, "complete")]
    assert rows[0].response_excerpt == "oops"
    assert {r.headers["idempotency-key"] for r in receiver.requests} == {"acme/shop:evt_1"}
    assert [r.headers["x-ledger-attempt"] for r in receiver.requests] == ["1", "2", "3"]
    for got in receiver.requests:
        standardwebhooks.Webhook(created.signing_secret).verify(got.body, got.headers)
    assert (after.consecutive_failures, after.blocked_until) == (0, None)
    assert json.loads(after.event_types) == ["order.paid"]


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http://[::1/"])
def test_a_url_no_retry_can_fix_fails_at_once(forwarder, url):
    result = forwarder.forward(_target(url), EVENT, BODY, "application/json")
    assert (result.outcome, result.http_status) == (Outcome.FAILED, None)


class _KeepAlive(BaseHTTPRequestHandler):
    """An HTTP/1.1 service that keeps connections open and notes each request's client port."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[int, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.client_address[1], self.path))
        self.send_response(200)
        self.send_header("X-Result-Ref", "first")
        self.send_header("X-Result-Ref", "second")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing."""


def test_a_kept_alive_connection_carries_the_next_forwards(forwarder):
    """Forwards to one destination reuse its pooled connection, the URL's path and query
    travel as written, and a header answered twice is read as both values."""
    _KeepAlive.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/in/a%20b?tenant=acme&x=1"
        results = [forwarder.forward(_target(url), EVENT, BODY, "application/json")
                   for _ in range(3)]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert [r.outcome for r in results] == [Outcome.COMPLETE] * 3
    assert {r.result_ref for r in results} == {"first, second"}
    ports = {port for port, _ in _KeepAlive.seen}
    assert len(_KeepAlive.seen) == 3 and len(ports) == 1  # one connection for all three
    assert {path for _, path in _KeepAlive.seen} == {"/in/a%20b?tenant=acme&x=1"}


class _Connections(_KeepAlive):
    """_KeepAlive that also notes each connection's end (the client closed it)."""

    closed: ClassVar[list[int]] = []

    def finish(self) -> None:
        super().finish()
        self.closed.append(self.client_address[1])


def _forward_on_threads(forwarder: Forwarder, url: str, threads: int, times: int) -> None:
    """Forward `times` events on each of `threads` threads, all alive until all are done."""
    together = threading.Barrier(threads)
    results: list[Outcome] = []

    def send() -> None:
        together.wait(timeout=10)
        results.extend(forwarder.forward(_target(url), EVENT, BODY, "application/json").outcome
                       for _ in range(times))
        together.wait(timeout=10)

    running = [threading.Thread(target=send) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(timeout=30)
    assert results == [Outcome.COMPLETE] * threads * times


def _closed_within(ports: set[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ports <= set(_Connections.closed):
            return True
        time.sleep(0.02)
    return False


def test_each_sending_thread_keeps_its_own_connection_and_none_outlives_its_use(forwarder):
    """A worker's send threads each reuse a connection of their own; the connections of a
    thread that ended are closed once another thread sends, and `close` closes the rest."""
    _Connections.seen, _Connections.closed = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Connections)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/in"
        _forward_on_threads(forwarder, url, 2, 3)
        first = [port for port, _ in _Connections.seen]
        assert len(first) == 6 and len(set(first)) == 2  # one connection per thread, reused
        assert all(first.count(port) == 3 for port in set(first))
        assert not set(first) & set(_Connections.closed)  # kept alive while nobody else sends

        _forward_on_threads(forwarder, url, 1, 1)  # a new thread: the ended ones' pools close
        assert _closed_within(set(first))
        last = _Connections.seen[-1][0]
        assert last not in first and last not in _Connections.closed

        forwarder.close()
        assert _closed_within({last})
    finally:
        server.shutdown()
        server.server_close()
        serving.join(timeout=10)
