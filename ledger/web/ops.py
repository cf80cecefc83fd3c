"""Operations endpoints for load balancers and Prometheus."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from flask.typing import ResponseReturnValue
from sqlalchemy import text

from ledger.db.engine import migration_status
from ledger.metrics.export import render_metrics

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """Answer while the process runs."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """Answer ready only when the database answers and migrations are at head."""
    engine = current_app.extensions["ledger"].engine
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current, head = migration_status(engine)
    except Exception as error:  # any failure here means: do not route traffic to us
        return jsonify({"status": "unready", "detail": f"database: {type(error).__name__}"}), 503
    if current != head:
        return jsonify({"status": "unready",
                        "detail": f"migrations at {current}, head is {head}"}), 503
    return jsonify({"status": "ready"})


@bp.get("/metrics")
def prometheus_metrics() -> Response:
    """Serve Prometheus metrics, aggregated over every process of this server."""
    svc = current_app.extensions["ledger"]
    body, content_type = render_metrics(
        svc.engine, svc.clock, revocation_bound_seconds=svc.settings.revocation_bound_seconds)
    return Response(body, content_type=content_type)
