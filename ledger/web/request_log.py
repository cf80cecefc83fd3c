"""Request ids and the per-request log line.

Every request gets a request id: the caller's `X-Request-Id` when it is sane
(a proxy or the sender set it), otherwise a fresh one. It is bound into the
structlog context for the request, so every log line written while serving
it carries `request_id`, and it is echoed in the `X-Request-Id` response
header so a sender's support ticket can be matched to our logs.
"""

from __future__ import annotations

import re
import time
import uuid

import structlog
from flask import Flask, Response, g, request

from ledger.logs import get_logger

REQUEST_ID_HEADER = "X-Request-Id"
# Printable, short, no spaces or quotes: safe in logs and headers as given.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")
# Probes and scrapes would drown the log; intake outcomes are logged by the intake itself.
QUIET_PATHS = ("/healthz", "/readyz", "/metrics", "/static/")
INTAKE_LOGGED_STATUSES = frozenset({200, 202, 401, 409})

log = get_logger("ledger.web")


def request_id_from(value: str | None) -> str:
    """Return the caller's request id if it is sane, else a new random one."""
    if value and SANE_REQUEST_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


def _start() -> None:
    """Bind the request id for every log line of this request."""
    g.request_started = time.perf_counter()
    g.request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
    # gthread and werkzeug reuse threads: start from an empty context each time.
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=g.request_id)


def _finish(response: Response) -> Response:
    """Echo the request id and log the request unless another line already told its story."""
    request_id = g.get("request_id")
    if request_id is None:  # a request that failed before before_request ran
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
    response.headers[REQUEST_ID_HEADER] = request_id
    if _should_log(response.status_code):
        started = g.get("request_started", time.perf_counter())
        rule = request.url_rule.rule if request.url_rule is not None else None
        log.info("http.request", method=request.method, route=rule or "unmatched",
                 status=response.status_code,
                 latency_ms=round((time.perf_counter() - started) * 1000, 2))
    return response


def _should_log(status: int) -> bool:
    """Skip probes, scrapes and intake answers the intake logged in detail."""
    path = request.path
    if path.startswith(QUIET_PATHS):
        return status >= 500
    return not (path.startswith("/hooks/") and status in INTAKE_LOGGED_STATUSES)


def _clear(_error: BaseException | None) -> None:
    """Leave no request context behind on this thread."""
    structlog.contextvars.clear_contextvars()


def init_app(app: Flask) -> None:
    """Install request ids and the request log line on the app."""
    app.before_request_funcs.setdefault(None, []).insert(0, _start)
    app.after_request(_finish)
    app.teardown_request(_clear)
