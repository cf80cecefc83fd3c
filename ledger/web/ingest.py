"""POST /hooks/<integration public id>: the sender-facing intake (JSON only).

The intake is the one hot path of the service, so it is served by a plain
WSGI handler, `IntakeFastPath`, installed in front of Flask: a delivery never
builds Flask's request context, session, before/after-request hooks or
response object, whose CPU would otherwise be most of a delivery's.
It does everything the Flask path did for it: request id (bound into every
log line and echoed in `X-Request-Id`), the heartbeat that registers this
process, the size limit while reading, the CONTRACT's JSON answers for every
domain error, metrics and one log line per delivery. The Flask route below
stays for routing (a GET gets 405) and serves through the same function when
the fast path is bypassed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import IO, Any

import structlog
from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.wsgi import get_content_length, get_input_stream

from ledger import metrics
from ledger.db.engine import is_unavailable
from ledger.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    InvalidEvent,
    StorageUnavailable,
    UnknownIntegration,
    UnreadableBody,
)
from ledger.ids import INTEGRATION_ID
from ledger.intake.credential_view import IntegrationAuth
from ledger.intake.delivery_log import Delivery
from ledger.intake.pipeline import IntakeAnswer
from ledger.intake.signatures import PROFILE_BODY_LIMITS
from ledger.intake.signatures.shared_token import PLAINTEXT_KEY, QUERY_KEY
from ledger.intake.signatures.token_profile import TOKEN
from ledger.logs import LineLogger, event_ref, get_logger
from ledger.services import Services
from ledger.web.body_deadline import BodyReadTimeout
from ledger.web.request_log import INTAKE_LOGGED_STATUSES, REQUEST_ID_HEADER, request_id_from

bp = Blueprint("ingest", __name__)
log = get_logger("ledger.intake")
# The one line every authenticated delivery writes, rendered without structlog's chain.
delivery_line = LineLogger("ledger.intake")
web_log = get_logger("ledger.web")
READ_CHUNK = 64 * 1024
ROUTE = "/hooks/<public_id>"
PREFIX = "/hooks/"
RETRY_AFTER_SECONDS = "5"
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
NO_CONTENT = 204
StartResponse = Callable[..., Any]


@dataclass(slots=True)
class HookAnswer:
    """One HTTP answer of the intake."""

    status: int
    body: dict[str, Any]
    headers: list[tuple[str, str]] = field(default_factory=list)
    text: str | None = None  # answered as text/plain instead of the JSON body

    @property
    def media_type(self) -> str:
        """Return the answer's Content-Type."""
        return JSON_TYPE if self.text is None else TEXT_TYPE

    def payload(self) -> bytes:
        """Return the answer's bytes."""
        return encode(self.body, self.status) if self.text is None else self.text.encode()


def read_body_within(stream: IO[bytes], declared: int | None, limit: int) -> bytes:
    """Read the raw body, never more than `limit` + 1 bytes, whatever Content-Length says."""
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        try:
            chunk = stream.read(min(READ_CHUNK, limit + 1 - size))
        except BodyReadTimeout:
            raise  # the sender was too slow: 408, not a malformed body
        except Exception as error:  # the server's own parser: gunicorn and werkzeug differ
            raise UnreadableBody(f"body could not be read ({type(error).__name__}): "
                                 "malformed chunked encoding or an interrupted upload"
                                 ) from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise BodyTooLarge(limit)
    return b"".join(chunks)


def environ_headers(environ: dict[str, Any]) -> dict[str, list[str]]:
    """Return the request headers with lower-cased names, as WSGI delivers them."""
    headers: dict[str, list[str]] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_") and key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
            name = key[5:].lower().replace("_", "-")
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            name = key.lower().replace("_", "-")
        else:
            continue
        headers.setdefault(name, []).append(value)
    return headers


def add_request_facts(headers: dict[str, list[str]], environ: dict[str, Any], *,
                      production: bool) -> None:
    """Add what a shared-token profile reads besides headers, as pseudo-headers.

    The scheme is the request's after LEDGER_TRUSTED_PROXIES (ProxyFix applies their
    X-Forwarded-Proto; a client's own is ignored), so a token that reached the
    ledger over plain HTTP is seen as such.
    """
    headers[QUERY_KEY] = [environ.get("QUERY_STRING") or ""]
    if production and environ.get("wsgi.url_scheme") != "https":
        headers[PLAINTEXT_KEY] = ["1"]


@dataclass(slots=True)
class Seen:
    """What the intake learned about a delivery before it answered (for the delivery log)."""

    auth: IntegrationAuth | None = None
    outcome: str = "internal"
    reason: str | None = None
    key_id: str | None = None
    event_id: str | None = None
    authenticated: bool = False


def answer_delivery(svc: Services, public_id: str, environ: dict[str, Any]) -> HookAnswer:
    """Authenticate, validate and durably claim one delivery; answer after commit."""
    seen = Seen()
    at = svc.clock.now()
    started = time.perf_counter()
    try:
        answer = _deliver(svc, public_id, environ, seen)
    except Exception as error:
        answer = refusal(svc, public_id, error, seen)
    record_delivery(svc, public_id, seen, answer, at=at, started=started,
                    client=environ.get("REMOTE_ADDR"))
    return answer


def record_delivery(svc: Services, public_id: str, seen: Seen, answer: HookAnswer, *,
                    at: Any, started: float, client: str | None) -> None:
    """Keep the delivery's row in the delivery log (when it is on)."""
    if not svc.delivery_log.enabled:
        return
    latency_us = int((time.perf_counter() - started) * 1_000_000)
    integration = seen.auth.integration if seen.auth is not None else None
    svc.delivery_log.record(Delivery(
        at=at, integration_id=integration.id if integration else None,
        public_id=public_id if INTEGRATION_ID.fullmatch(public_id) else None,
        outcome=seen.outcome, http_status=answer.status, key_id=seen.key_id,
        event_id=seen.event_id, client=client, reason=seen.reason,
        authenticated=seen.authenticated, latency_us=latency_us))


def refusal(svc: Services, public_id: str, error: Exception, seen: Seen) -> HookAnswer:
    """Map a domain error of the pipeline (or any other) to the CONTRACT's answer."""
    if isinstance(error, UnknownIntegration):
        seen.outcome, seen.reason = "unknown_integration", "no integration has this public id"
        metrics.DELIVERIES.labels("unknown_integration").inc()
        return HookAnswer(404, {"error": "unknown_integration"})
    if isinstance(error, AuthenticationFailed):
        seen.outcome, seen.reason, seen.key_id = "unauthenticated", error.reason, error.key_id
        seen.event_id = error.event_id
        metrics.DELIVERIES.labels("unauthenticated").inc()
        metrics.AUTH_FAILURES.labels(error.reason).inc()
        return HookAnswer(401, {"error": "unauthenticated"})
    if isinstance(error, InvalidEvent):
        seen.outcome, seen.reason, seen.key_id = "invalid_event", error.detail, error.key_id
        seen.authenticated = error.key_id is not None
        metrics.DELIVERIES.labels("invalid_event").inc()
        # A body that could not be read leaves the stream in an unknown place.
        close = [("Connection", "close")] if isinstance(error, UnreadableBody) else []
        return HookAnswer(400, {"error": "invalid_event", "detail": error.detail}, close)
    if isinstance(error, BodyTooLarge):
        seen.outcome, seen.reason = "body_too_large", f"body over {error.limit} bytes"
        metrics.DELIVERIES.labels("body_too_large").inc()
        # The rest of the body was never read: the connection cannot be reused.
        return HookAnswer(413, {"error": "body_too_large"}, [("Connection", "close")])
    if isinstance(error, BodyReadTimeout):
        metrics.DELIVERIES.labels("request_timeout").inc()
        web_log.warning("delivery.body_timeout", integration=public_id,
                        seconds=svc.settings.body_read_timeout_seconds)
        # The sender stopped sending: the rest of its body is never read.
        return HookAnswer(408, {"error": "request_timeout"}, [("Connection", "close")])
    if isinstance(error, StorageUnavailable):
        seen.outcome, seen.reason = "unavailable", str(error)
        return _unavailable(str(error), public_id)
    if is_unavailable(error):
        seen.outcome, seen.reason = "unavailable", type(error).__name__
        return _unavailable(type(error).__name__, public_id)
    # Log the class only: messages of driver errors can quote bound parameters.
    seen.reason = type(error).__name__
    web_log.error("request.failed", error_class=type(error).__name__,
                  path=PREFIX + public_id)
    return HookAnswer(500, {"error": "internal"})


def _unavailable(reason: str, public_id: str) -> HookAnswer:
    """Answer 503 with a Retry-After: the sender should simply retry."""
    metrics.DELIVERIES.labels("unavailable").inc()
    web_log.warning("storage.unavailable", error=reason, path=PREFIX + public_id)
    return HookAnswer(503, {"error": "unavailable"}, [("Retry-After", RETRY_AFTER_SECONDS)])


def body_limit(svc: Services, auth: IntegrationAuth | None) -> int:
    """Return the body limit: the integration's own, else its sender's cap, else the global."""
    limit = svc.settings.max_body_bytes
    if auth is not None:
        # The integration's own limit, else its sender's cap (GitHub's 25 MB), else the global.
        integration = auth.integration
        limit = (integration.max_body_bytes or PROFILE_BODY_LIMITS.get(integration.profile)
                 or limit)
    return limit


def note_refused_signature(public_id: str, auth: IntegrationAuth,
                           failure: AuthenticationFailed) -> None:
    """Log a signature the pipeline refused; count the use of a dead key."""
    log.warning("delivery.unauthenticated", integration=public_id,
                scope=auth.integration.scope, reason=failure.reason, key_id=failure.key_id)
    if failure.key_id is not None:
        metrics.DEAD_KEY_USE.labels(failure.reason.removesuffix("_key")).inc()


def answered(answer: IntakeAnswer, seen: Seen, started: float) -> HookAnswer:
    """Count and log an authenticated delivery's answer; return it as HTTP."""
    elapsed = time.perf_counter() - started
    outcome = answer.outcome
    seen.outcome, seen.key_id, seen.authenticated = outcome, answer.key_id, True
    seen.event_id = answer.event_id
    metrics.DELIVERIES.labels(outcome).inc()
    metrics.INTAKE_LATENCY.observe(elapsed)
    delivery_line.info("delivery." + outcome, outcome=outcome, scope=answer.scope,
             event_ref=event_ref(answer.scope, answer.event_id), event_type=answer.event_type,
             http_status=answer.status, latency_ms=round(elapsed * 1000, 2))
    return HookAnswer(answer.status, answer.body, text=answer.text)


def _deliver(svc: Services, public_id: str, environ: dict[str, Any], seen: Seen) -> HookAnswer:
    """The pipeline with domain errors raised (refusal maps them)."""
    started = time.perf_counter()
    auth = seen.auth = svc.intake.lookup(public_id)
    body = read_body_within(get_input_stream(environ), get_content_length(environ),
                            body_limit(svc, auth))
    if auth is None:
        raise UnknownIntegration()
    headers = environ_headers(environ)
    if auth.integration.profile == TOKEN:  # only a token profile pays for these facts
        add_request_facts(headers, environ, production=svc.settings.production)
    try:
        answer = svc.intake.accept(auth, headers, body)
    except AuthenticationFailed as failure:
        note_refused_signature(public_id, auth, failure)
        raise
    return answered(answer, seen, started)


def encode(body: dict[str, Any], status: int = 200) -> bytes:
    """Return the JSON bytes of an answer, as Flask's jsonify writes them (204: none)."""
    if status == NO_CONTENT:
        return b""  # Discord's Webhook Events PING: 204 with an empty body
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


@bp.post(ROUTE)
def receive(public_id: str) -> Response:
    """Serve a delivery that reached Flask (the fast path normally answers first)."""
    answer = answer_delivery(current_app.extensions["ledger"], public_id, request.environ)
    return current_app.response_class(answer.payload(), status=answer.status,
                                      headers=answer.headers, content_type=answer.media_type)


class IntakeFastPath:
    """WSGI middleware: answer `POST /hooks/<id>` without building a Flask request."""

    def __init__(self, app: Flask, inner: Callable[..., Iterable[bytes]]) -> None:
        self._services: Services = app.extensions["ledger"]
        self._inner = inner

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        """Serve an intake delivery here; pass everything else to Flask."""
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") != "POST" or not path.startswith(PREFIX):
            return self._inner(environ, start_response)
        public_id = path[len(PREFIX):]
        if not public_id or "/" in public_id:
            return self._inner(environ, start_response)  # Flask answers 404
        return self._serve(public_id, environ, start_response)

    def _serve(self, public_id: str, environ: dict[str, Any],
               start_response: StartResponse) -> list[bytes]:
        started = time.perf_counter()
        request_id = request_id_from(environ.get("HTTP_X_REQUEST_ID"))
        # gthread reuses threads: start from an empty log context each time.
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            if self._services.heartbeat is not None:
                self._services.heartbeat.ensure_started()
            answer = answer_delivery(self._services, public_id, environ)
            if answer.status not in INTAKE_LOGGED_STATUSES:
                web_log.info("http.request", method="POST", route=ROUTE,
                             status=answer.status,
                             latency_ms=round((time.perf_counter() - started) * 1000, 2))
        finally:
            structlog.contextvars.clear_contextvars()
        payload = answer.payload()
        headers = [("Content-Type", answer.media_type), ("Content-Length", str(len(payload))),
                   *answer.headers, (REQUEST_ID_HEADER, request_id)]
        start_response(f"{answer.status} {HTTPStatus(answer.status).phrase}", headers)
        return [payload]


def init_app(app: Flask) -> None:
    """Register the route and put the fast path in front of Flask."""
    app.register_blueprint(bp)
    # why: wrapping the wsgi_app attribute is Flask's documented middleware hook; mypy sees a
    # method being replaced.
    app.wsgi_app = IntakeFastPath(app, app.wsgi_app)  # type: ignore[method-assign]
