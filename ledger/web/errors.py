"""One place that maps domain errors to HTTP answers (JSON for the API and intake)."""

from __future__ import annotations

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from ledger import metrics
from ledger.db import is_unavailable
from ledger.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    InvalidEvent,
    StorageUnavailable,
    UnknownIntegration,
)
from ledger.logs import get_logger

log = get_logger("ledger.web")
RETRY_AFTER_SECONDS = "5"


def wants_json() -> bool:
    """Tell whether the client should get JSON rather than an HTML page."""
    if request.path.startswith(("/hooks/", "/api/", "/healthz", "/readyz", "/openapi")):
        return True
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "application/json"


def _json(status: int, body: dict[str, object]):  # type: ignore[no-untyped-def]
    """Return a JSON response with the given status."""
    response = jsonify(body)
    response.status_code = status
    return response


def register_error_handlers(app: Flask) -> None:
    """Install the domain-error → HTTP mapping on the app."""

    @app.errorhandler(UnknownIntegration)
    def _unknown(_e: UnknownIntegration):  # type: ignore[no-untyped-def]
        metrics.DELIVERIES.labels("unknown_integration").inc()
        return _json(404, {"error": "unknown_integration"})

    @app.errorhandler(AuthenticationFailed)
    def _unauthenticated(e: AuthenticationFailed):  # type: ignore[no-untyped-def]
        metrics.DELIVERIES.labels("unauthenticated").inc()
        metrics.AUTH_FAILURES.labels(e.reason).inc()
        return _json(401, {"error": "unauthenticated"})

    @app.errorhandler(InvalidEvent)
    def _invalid(e: InvalidEvent):  # type: ignore[no-untyped-def]
        metrics.DELIVERIES.labels("invalid_event").inc()
        return _json(400, {"error": "invalid_event", "detail": e.detail})

    @app.errorhandler(BodyTooLarge)
    def _too_large(_e: BodyTooLarge):  # type: ignore[no-untyped-def]
        metrics.DELIVERIES.labels("body_too_large").inc()
        response = _json(413, {"error": "body_too_large"})
        # The rest of the body was never read: the connection cannot be reused.
        response.headers["Connection"] = "close"
        return response

    @app.errorhandler(StorageUnavailable)
    def _unavailable(e: StorageUnavailable):  # type: ignore[no-untyped-def]
        metrics.DELIVERIES.labels("unavailable").inc()
        log.warning("storage.unavailable", error=str(e), path=request.path)
        response = _json(503, {"error": "unavailable"})
        response.headers["Retry-After"] = RETRY_AFTER_SECONDS
        return response

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException):  # type: ignore[no-untyped-def]
        if wants_json():
            response = _json(e.code or 500, {"error": (e.name or "error").lower()
                                                     .replace(" ", "_")})
            for name, value in e.get_headers():
                if name.lower() != "content-type":
                    response.headers[name] = value
            return response
        return e

    @app.errorhandler(Exception)
    def _unexpected(e: Exception):  # type: ignore[no-untyped-def]
        if is_unavailable(e):
            return _unavailable(StorageUnavailable(type(e).__name__))
        # Log the class only: messages of driver errors can quote bound parameters.
        log.error("request.failed", error_class=type(e).__name__, path=request.path)
        if wants_json():
            return _json(500, {"error": "internal"})
        return "Internal error", 500
