"""An async intake, measured: `POST /hooks/<id>` as an ASGI app under uvicorn (experimental).

Not the shipped intake and not in the Procfile: it exists to be measured against it
(docs: explanation/performance.md, "An async intake, measured"). It serves the intake
route, /healthz and /metrics only, on PostgreSQL only.

A delivery runs the shipped intake's steps in the same order, from the same code:
the integration from the process's credential view, the body read within its limit
(413 without reading the rest), then the ledger's pipeline (`Intake`): signature
profiles, scope, validation. The claim, the one statement of the shipped PostgreSQL
claim (`_CLAIM_WITH_JOB`: receipt + job, or the recorded receipt of a taken id), runs
on psycopg's async driver from a psycopg_pool `AsyncConnectionPool`, in autocommit:
one transaction. What the fast path does not cover (a batch, a handshake, an id the
signature does not cover, a refused signature with its key reload and dead-key lookup,
a conflict's record) runs the shipped pipeline itself in a thread, so every answer
is the CONTRACT's. Answers, metrics, log lines and the delivery log are the shipped
intake's functions (ledger.web.ingest).

The limits it carries (each tested in tests/integration/test_asgi_intake.py):

- header deadline: a request whose head is not complete LEDGER_BODY_READ_TIMEOUT_SECONDS
  after its first byte is answered 408 and closed; a connection that sends nothing is
  closed after the same time (`DeadlineProtocol`);
- head size: more than HEAD_LIMIT bytes or MAX_FIELDS header lines before the head is
  complete is answered 431 and closed (gunicorn.conf.py's limits, in bytes and fields);
- body deadline: the body must arrive within LEDGER_BODY_READ_TIMEOUT_SECONDS of the
  first read, else 408 and close;
- body size: the integration's limit (413, the connection closed, the rest unread);
- graceful shutdown: on SIGTERM uvicorn stops accepting, waits up to GRACEFUL_SECONDS
  for requests in flight, then the pool closes and the delivery log is written;
- per-process metrics: prometheus-client's multiprocess files, one per worker, summed
  by /metrics; a stopped worker's live gauges are dropped.

    python -m bench.asgi_intake --bind 127.0.0.1:8000 [--workers N]

uvicorn rather than granian: the header deadline and the head limits need a hook
inside the HTTP protocol, and uvicorn's protocol is a Python class that can be
subclassed (httptools parses, uvloop runs the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy.engine import make_url
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ledger.config import Settings, WebServerSettings, metrics_multiproc_dir
from ledger.db.driver import time_to_driver
from ledger.domain import ConflictKind, ReceiptState
from ledger.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    InvalidEvent,
    StorageUnavailable,
    UnknownIntegration,
    UnreadableBody,
)
from ledger.intake.pipeline import IntakeAnswer, duplicate_answer
from ledger.intake.signatures import HeaderMap, profile_for
from ledger.intake.signatures.profile import FORM, JSON_ARRAY
from ledger.intake.signatures.token_profile import TOKEN
from ledger.intake.store import _DRIVER_CLAIM, NewEvent, RecordedOutcome, record_conflict
from ledger.services import Services, build_services
from ledger.web.body_deadline import BodyReadTimeout
from ledger.web.ingest import (
    JSON_TYPE,
    PREFIX,
    HookAnswer,
    Seen,
    add_request_facts,
    answered,
    body_limit,
    encode,
    note_refused_signature,
    record_delivery,
    refusal,
)
from ledger.web.request_log import REQUEST_ID_HEADER, request_id_from

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

HEAD_LIMIT = 64 * 1024  # the buffering worker's; gunicorn's line and field limits fit in it
MAX_FIELDS = 64  # gunicorn.conf.py's limit_request_fields
GRACEFUL_SECONDS = 30  # gunicorn.conf.py's graceful_timeout
KEEPALIVE_SECONDS = 5  # gunicorn.conf.py's keepalive
DEFAULT_DEADLINE_SECONDS = 10.0
TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: 29\r\n\r\n"
                  b'{"error": "request_timeout"}\n')
_TOO_LARGE = b'{"error": "headers_too_large"}\n'
HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                  b"Content-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(_TOO_LARGE), _TOO_LARGE))
_CLAIM_TRIES = 3


def _deadline_seconds() -> float:
    """Return LEDGER_BODY_READ_TIMEOUT_SECONDS (the protocol has no app to ask)."""
    raw = os.environ.get("LEDGER_BODY_READ_TIMEOUT_SECONDS")
    return float(raw) if raw else DEFAULT_DEADLINE_SECONDS


class _HeadRefused(Exception):
    """The request head went past HEAD_LIMIT or MAX_FIELDS."""


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and head limits.

    From a request's first byte its head has the deadline to be complete; a connection
    that sends nothing at all is closed after it too. A slow head holds a buffer and a
    timer on the event loop, never a worker.
    """

    # why: uvicorn's own override narrows the transport the same way (its ignore says so).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the idle deadline of a new connection."""
        self._in_head = True
        self._head_bytes = 0  # received while the head is incomplete
        self._parsed_bytes = 0  # of request line and fields, as parsed
        self._head_fields = 0
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(_deadline_seconds(), self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes:
            self.transport.write(TIMEOUT_ANSWER)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the timer with the connection."""
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; refuse a head that outgrows the limits."""
        if self._in_head and not self._head_bytes:
            self._arm()  # the deadline starts at the request's first byte
        if self._in_head:
            self._head_bytes += len(data)
        try:
            super().data_received(data)
            if self._in_head and self._head_bytes > HEAD_LIMIT:  # still no end of head
                raise _HeadRefused()
        except _HeadRefused:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(HEAD_TOO_LARGE)
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        """Count the head's bytes."""
        self._count(len(url), fields=0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count the head's fields and bytes."""
        self._count(len(name) + len(value), fields=1)
        super().on_header(name, value)

    def _count(self, size: int, fields: int) -> None:
        self._parsed_bytes += size
        self._head_fields += fields
        if self._parsed_bytes > HEAD_LIMIT or self._head_fields > MAX_FIELDS:
            self._refused = True
            # httptools stops parsing and raises a parser error: send_400_response below
            raise _HeadRefused()

    def send_400_response(self, msg: str) -> None:
        """Answer a head refused by the limits 431; any other parser error as uvicorn does."""
        if not self._refused:
            super().send_400_response(msg)
            return
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(HEAD_TOO_LARGE)
            self.transport.close()

    def on_headers_complete(self) -> None:
        """The head is in: its deadline ends (the body's is the app's)."""
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The next request on this connection starts a new head."""
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = self._parsed_bytes = self._head_fields = 0


def _conninfo(url: str) -> str:
    """Return the libpq URL of the ledger's SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _headers(scope: Scope) -> dict[str, list[str]]:
    """Return the request headers with lower-cased names, as the pipeline reads them."""
    headers: dict[str, list[str]] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return headers


class AsyncIntake:
    """The ASGI app: the intake route, /healthz, /metrics; lifespan opens and closes."""

    def __init__(self, services: Services, pool: AsyncConnectionPool) -> None:
        self.svc = services
        self.pool = pool
        self._claim_sql = _DRIVER_CLAIM.sql(services.engine.dialect)
        self._to_driver = time_to_driver(services.engine.dialect)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path.startswith(PREFIX) and "/" not in path[len(PREFIX):] and path != PREFIX:
            if method != "POST":
                await _send_json(send, 405, {"error": "method_not_allowed"})
                return
            await self._serve(path[len(PREFIX):], scope, receive, send)
        elif path == "/healthz":
            await _send_json(send, 200, {"status": "ok"})
        elif path == "/metrics":
            await self._metrics(scope, send)
        else:
            await _send_json(send, 404, {"error": "not_found"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.pool.open(wait=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.pool.close()
                await asyncio.to_thread(self.svc.close)
                if metrics_multiproc_dir():
                    from prometheus_client import multiprocess

                    multiprocess.mark_process_dead(os.getpid())
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _metrics(self, scope: Scope, send: Send) -> None:
        """Serve Prometheus metrics to a loopback client (or one with the token)."""
        headers = _headers(scope)
        token = self.svc.settings.metrics_token
        if token:
            given = headers.get("authorization", [""])[0]
            if given != f"Bearer {token}":
                await _send_json(send, 401, {"error": "unauthenticated"})
                return
        else:
            client = (scope.get("client") or ("", 0))[0]
            try:
                loopback = ipaddress.ip_address(client).is_loopback
            except ValueError:
                loopback = False
            if not loopback or "x-forwarded-for" in headers:
                await _send_json(send, 403, {"error": "forbidden"})
                return
        from ledger.metrics.export import render_metrics

        svc = self.svc
        body, content_type = await asyncio.to_thread(
            render_metrics, svc.engine, svc.clock,
            revocation_bound_seconds=svc.settings.revocation_bound_seconds,
            replica=svc.reads.replica)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _serve(self, public_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        given = headers.get("x-request-id")
        request_id = request_id_from(given[0] if given else None)
        structlog.contextvars.clear_contextvars()  # each request is its own task
        structlog.contextvars.bind_contextvars(request_id=request_id)
        if self.svc.heartbeat is not None:
            self.svc.heartbeat.ensure_started()
        seen = Seen()
        at = self.svc.clock.now()
        started = time.perf_counter()
        try:
            answer = await self._deliver(public_id, scope, headers, receive, seen, started)
        except Exception as error:
            answer = refusal(self.svc, public_id, error, seen)
        client = (scope.get("client") or (None, 0))[0]
        record_delivery(self.svc, public_id, seen, answer, at=at, started=started,
                        client=client)
        payload = answer.payload()
        out = [(b"content-type", answer.media_type.encode()),
               (b"content-length", str(len(payload)).encode()),
               *((k.lower().encode(), v.encode()) for k, v in answer.headers),
               (REQUEST_ID_HEADER.lower().encode(), request_id.encode())]
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        await send({"type": "http.response.body", "body": payload})

    async def _deliver(self, public_id: str, scope: Scope, headers: dict[str, list[str]],
                       receive: Receive, seen: Seen, started: float) -> HookAnswer:
        auth = seen.auth = await self._lookup(public_id)
        declared = headers.get("content-length")
        body = await self._read_body(receive, int(declared[0]) if declared else None,
                                     body_limit(self.svc, auth))
        if auth is None:
            raise UnknownIntegration()
        if auth.integration.profile == TOKEN:
            add_request_facts(headers, {"QUERY_STRING": scope["query_string"].decode("latin-1"),
                                        "wsgi.url_scheme": scope["scheme"]},
                              production=self.svc.settings.production)
        try:
            answer = await self._accept(auth, headers, body)
        except AuthenticationFailed as failure:
            note_refused_signature(public_id, auth, failure)
            raise
        return answered(answer, seen, started)

    async def _lookup(self, public_id: str) -> Any:
        """Return the integration from the credential view; a read of the database off-loop."""
        view = self.svc.view
        found = view.cached(public_id)
        if found is not None:
            return found
        return await asyncio.to_thread(self.svc.intake.lookup, public_id)

    async def _read_body(self, receive: Receive, declared: int | None, limit: int) -> bytes:
        """Read the body within `limit` and the deadline (from the first read)."""
        if declared is not None and declared > limit:
            raise BodyTooLarge(limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.svc.settings.body_read_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise UnreadableBody("body could not be read: an interrupted upload")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise BodyTooLarge(limit)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise BodyReadTimeout() from None
        return b"".join(chunks)

    async def _accept(self, auth: Any, headers: HeaderMap, body: bytes) -> IntakeAnswer:
        """The pipeline: its steps on the loop, the claim on the async pool."""
        intake = self.svc.intake
        integration = auth.integration
        profile = profile_for(integration)
        if (not profile.id_is_signed or profile.handshake is not None
                or profile.batch_items is not None or profile.body_format == JSON_ARRAY):
            return await asyncio.to_thread(intake.accept, auth, headers, body)
        now = self.svc.clock.now()
        try:
            key, verified = intake._authenticate(auth, profile, headers, body)
        except AuthenticationFailed:
            # The shipped pipeline: a key reload, the dead keys, the signed event id.
            return await asyncio.to_thread(intake.accept, auth, headers, body)
        if verified.token is not None:
            # A one-time signature token (Mailgun) is claimed with the receipt: shipped path.
            return await asyncio.to_thread(intake.accept, auth, headers, body)
        try:
            body_format, payload = intake._payload(profile, headers, body)
            event = intake._new_event(integration.id, profile, headers, payload, body, now,
                                      form=body_format == FORM, received=True)
        except InvalidEvent as invalid:
            invalid.key_id = key.key_id
            raise
        status, answer = await self._claim(event)
        return IntakeAnswer(status=status, body=answer, scope=integration.scope,
                            event_id=event.event_id, event_type=event.event_type,
                            outcome=answer["status"], key_id=key.key_id,
                            text=profile.success_body if status < 300 else None)

    async def _claim(self, event: NewEvent) -> tuple[int, dict[str, Any]]:
        """Claim receipt + job in one autocommit statement; answer from the ledger if taken."""
        params = {"scope_id": event.scope_id, "event_id": event.event_id,
                  "event_type": event.event_type,
                  "accepted_at": self._to_driver(event.accepted_at),
                  "body_sha256": event.body_sha256, "payload": event.payload,
                  "content_type": event.content_type, "raw_body": event.raw_body}
        for _ in range(_CLAIM_TRIES):
            try:
                async with self.pool.connection() as conn:
                    cursor = await conn.execute(self._claim_sql, params)
                    row = await cursor.fetchone()
            except (PoolTimeout, psycopg.OperationalError) as error:
                raise StorageUnavailable(type(error).__name__) from None
            except psycopg.Error as error:
                raise RuntimeError(f"intake claim failed: {type(error).__name__}") from None
            if row is not None and row[0]:
                return 202, {"status": "accepted", "event_id": event.event_id,
                             "state": ReceiptState.PENDING.value}
            if row is None:
                continue  # the holder was purged, or is not visible yet: claim again
            existing = RecordedOutcome(state=ReceiptState.from_code(row[1]),
                                       body_sha256=bytes(row[2]), result_ref=row[3])
            if existing.body_sha256 != event.body_sha256:
                await asyncio.to_thread(self._record_conflict, event, existing)
                return 409, {"status": "conflict", "event_id": event.event_id}
            return duplicate_answer(event.event_id, existing)
        raise StorageUnavailable("the ledger changed under this delivery three times")

    def _record_conflict(self, event: NewEvent, existing: RecordedOutcome) -> None:
        from ledger.db.engine import storage_guard

        with storage_guard(), self.svc.engine.begin() as conn:
            record_conflict(conn, scope_id=event.scope_id, event_id=event.event_id,
                            kind=ConflictKind.DIFFERENT_BODY, original_event_id=event.event_id,
                            original_sha256=existing.body_sha256,
                            incoming_sha256=event.body_sha256, now=event.accepted_at,
                            incoming_body=event.payload)


async def _send_json(send: Send, status: int, document: dict[str, Any]) -> None:
    payload = encode(document, status)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", JSON_TYPE.encode()),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def create() -> AsyncIntake:
    """Build the app of one worker process from the environment (uvicorn's factory)."""
    from ledger.logs import configure_logging

    settings = Settings.from_env()
    if not settings.database_url.startswith("postgresql"):
        raise SystemExit("the async intake serves PostgreSQL only (DATABASE_URL)")
    configure_logging(settings.log_level)
    services = build_services(settings)
    options = (f"-c statement_timeout={settings.statement_timeout_ms} "
               f"-c lock_timeout={settings.lock_timeout_ms} "
               "-c idle_in_transaction_session_timeout=60000")
    pool = AsyncConnectionPool(
        _conninfo(settings.database_url), min_size=settings.pool_size,
        max_size=settings.pool_size, timeout=settings.pool_timeout_seconds, open=False,
        kwargs={"autocommit": True, "connect_timeout": 3, "options": options})
    return AsyncIntake(services, pool)


def main(argv: list[str] | None = None) -> None:
    """Serve the async intake with WEB_CONCURRENCY uvicorn worker processes."""
    import uvicorn

    from ledger.web.gunicorn_conf import prepare_metrics_dir  # sets PROMETHEUS_MULTIPROC_DIR

    web = WebServerSettings.from_env()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bind", default=web.bind)
    parser.add_argument("--workers", type=int, default=web.workers)
    args = parser.parse_args(argv)
    prepare_metrics_dir()
    host, _, port = args.bind.rpartition(":")
    uvicorn.run("bench.asgi_intake:create", factory=True, host=host or "127.0.0.1",
                port=int(port), workers=args.workers, loop="uvloop", http=DeadlineProtocol,
                lifespan="on", timeout_graceful_shutdown=GRACEFUL_SECONDS,
                timeout_keep_alive=KEEPALIVE_SECONDS, access_log=False, log_level="warning",
                server_header=False, proxy_headers=False)


if __name__ == "__main__":
    main()
