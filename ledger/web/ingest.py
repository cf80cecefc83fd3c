"""POST /hooks/<integration public id>: the sender-facing intake (JSON only)."""

from __future__ import annotations

import time

from flask import Blueprint, current_app, jsonify, request

from ledger import metrics
from ledger.errors import AuthenticationFailed, BodyTooLarge, UnknownIntegration
from ledger.logs import event_ref, get_logger
from ledger.services import Services

bp = Blueprint("ingest", __name__)
log = get_logger("ledger.intake")
READ_CHUNK = 64 * 1024


def services() -> Services:
    """Return this app's services."""
    return current_app.extensions["ledger"]


def read_body_within(limit: int) -> bytes:
    """Read the raw body, never more than `limit` + 1 bytes, whatever Content-Length says."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    stream = request.stream
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = stream.read(min(READ_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise BodyTooLarge(limit)
    return b"".join(chunks)


def header_map() -> dict[str, list[str]]:
    """Return the request headers with lower-cased names and every value received."""
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    return headers


@bp.post("/hooks/<public_id>")
def receive(public_id: str):  # type: ignore[no-untyped-def]
    """Authenticate, validate and durably claim one delivery; answer after commit."""
    started = time.perf_counter()
    svc = services()
    auth = svc.intake.lookup(public_id)
    limit = svc.settings.max_body_bytes
    if auth is not None and auth.integration.max_body_bytes:
        limit = auth.integration.max_body_bytes
    body = read_body_within(limit)
    if auth is None:
        raise UnknownIntegration()
    try:
        answer = svc.intake.accept(auth, header_map(), body)
    except AuthenticationFailed as failure:
        log.warning("delivery.unauthenticated", integration=public_id,
                    scope=auth.integration.scope, reason=failure.reason,
                    key_id=failure.key_id)
        if failure.key_id is not None:
            metrics.DEAD_KEY_USE.labels(failure.reason.removesuffix("_key")).inc()
        raise
    elapsed = time.perf_counter() - started
    outcome = answer.body["status"]
    metrics.DELIVERIES.labels(outcome).inc()
    metrics.INTAKE_LATENCY.observe(elapsed)
    log.info("delivery." + outcome, outcome=outcome, scope=answer.scope,
             event_ref=event_ref(answer.scope, answer.event_id), event_type=answer.event_type,
             http_status=answer.status, latency_ms=round(elapsed * 1000, 2))
    response = jsonify(answer.body)
    response.status_code = answer.status
    return response
