"""Maps errors to HTTP answers for Flask routes (the intake maps its own: web/ingest.py)."""

from __future__ import annotations

from flask import Flask, Response, jsonify, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from ledger import metrics
from ledger.db.engine import is_unavailable
from ledger.errors import StorageUnavailable
from ledger.logs import get_logger

log = get_logger("ledger.web")
RETRY_AFTER_SECONDS = "5"


def wants_json() -> bool:
    """Tell whether the client should get JSON rather than an HTML page."""
    if request.path.startswith(("/hooks/", "/api/", "/healthz", "/readyz", "/openapi")):
        return True
    if request.headers.get("HX-Request"):
        # htmx sends `Accept: */*` and swaps what it gets into the page: it wants HTML.
        return False
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "application/json"


def _route() -> str:
    """Return the matched route pattern: the path itself can carry an event id."""
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


def _json(status: int, body: dict[str, object]) -> Response:
    """Return a JSON response with the given status."""
    response = jsonify(body)
    response.status_code = status
    return response


def register_error_handlers(app: Flask) -> None:
    """Install the domain-error → HTTP mapping on the app."""

    @app.errorhandler(StorageUnavailable)
    def _unavailable(e: StorageUnavailable) -> Response:
        metrics.DELIVERIES.labels("unavailable").inc()
        log.warning("storage.unavailable", error=str(e), route=_route())
        response = _json(503, {"error": "unavailable"})
        response.headers["Retry-After"] = RETRY_AFTER_SECONDS
        return response

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException) -> Response | HTTPException:
        if wants_json():
            response = _json(e.code or 500, {"error": (e.name or "error").lower()
                                                     .replace(" ", "_")})
            for name, value in e.get_headers():
                if name.lower() != "content-type":
                    response.headers[name] = value
            return response
        return e

    @app.errorhandler(Exception)
    def _unexpected(e: Exception) -> ResponseReturnValue:
        if is_unavailable(e):
            return _unavailable(StorageUnavailable(type(e).__name__))
        # Log the class only: messages of driver errors can quote bound parameters.
        log.error("request.failed", error_class=type(e).__name__, route=_route())
        if wants_json():
            return _json(500, {"error": "internal"})
        return "Internal error", 500
