"""Operations endpoints for load balancers and Prometheus."""

from __future__ import annotations

import hmac
import ipaddress

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from ledger.db.engine import commit_stall, migration_status
from ledger.metrics.export import render_metrics

bp = Blueprint("ops", __name__)
# How long /readyz lets a probe commit wait before it calls commits stalled.
READY_COMMIT_SECONDS = 2.0


@bp.get("/healthz")
def healthz() -> Response:
    """Answer while the process runs."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """Answer ready only when the database answers and migrations are at head."""
    engine = current_app.extensions["ledger"].engine
    try:
        stalled = commit_stall(engine, READY_COMMIT_SECONDS)
        current, head = migration_status(engine)
    except Exception as error:  # any failure here means: do not route traffic to us
        return jsonify({"status": "unready", "detail": f"database: {type(error).__name__}"}), 503
    if stalled is not None:
        return jsonify({"status": "unready", "detail": f"database: {stalled}"}), 503
    if current != head:
        return jsonify({"status": "unready",
                        "detail": f"migrations at {current}, head is {head}"}), 503
    return jsonify({"status": "ready"})


def _metrics_refusal(token: str | None) -> Response | None:
    """Refuse a scrape from outside the monitoring path (README "Metrics"), else None.

    With LEDGER_METRICS_TOKEN set, a scrape needs `Authorization: Bearer <token>`.
    Without it, only a loopback client reaching gunicorn directly may scrape: a
    request that came through a proxy (X-Forwarded-For) is refused as well.
    """
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
            return None
        response = jsonify({"error": "unauthenticated"})
        response.status_code = 401
        response.headers["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        loopback = ipaddress.ip_address(request.remote_addr or "").is_loopback
    except ValueError:
        loopback = False
    if loopback and "X-Forwarded-For" not in request.headers:
        return None
    response = jsonify({"error": "forbidden", "detail": "set LEDGER_METRICS_TOKEN to scrape "
                                                        "from another host"})
    response.status_code = 403
    return response


@bp.get("/metrics")
def prometheus_metrics() -> Response:
    """Serve Prometheus metrics, aggregated over every process of this server."""
    svc = current_app.extensions["ledger"]
    refusal = _metrics_refusal(svc.settings.metrics_token)
    if refusal is not None:
        return refusal
    body, content_type = render_metrics(
        svc.engine, svc.clock, revocation_bound_seconds=svc.settings.revocation_bound_seconds,
        replica=svc.reads.replica)
    return Response(body, content_type=content_type)
