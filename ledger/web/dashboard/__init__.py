"""The operator dashboard: server-rendered pages, htmx fragments, audited actions."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    g,
    jsonify,
    make_response,
    render_template,
    request,
)
from flask.typing import ResponseReturnValue
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from ledger.web.auth import init_security, require_login
from ledger.web.errors import wants_json

bp = Blueprint("dashboard", __name__)
bp.before_request(require_login)


@bp.errorhandler(400)
@bp.errorhandler(404)
def _error_page(error: HTTPException) -> ResponseReturnValue:
    """Answer a bad or missing dashboard URL with a page (JSON clients get JSON)."""
    if wants_json():
        response = jsonify({"error": "bad_request" if error.code == 400 else "not_found"})
        response.status_code = error.code or 400
        return response
    titles = {400: ("Bad request", "The link or form had a value this page cannot use."),
              404: ("Not found", "Nothing here: the receipt, integration or page is unknown.")}
    title, message = titles[error.code or 400]
    return render_template("error.html", status=error.code, title=title,
                           message=message), error.code or 400


def is_fragment_request() -> bool:
    """Tell whether htmx asked for a fragment (not a boosted full-page navigation)."""
    return bool(request.headers.get("HX-Request")) and not request.headers.get("HX-Boosted")


def render(page: str, partial: str | None = None, /, *, status: int = 200,
           **context: Any) -> Response:
    """Render the full page, or only its partial when htmx asks; either way Vary: HX-Request."""
    fragment = bool(partial) and is_fragment_request()
    body = render_template(partial if fragment and partial else page, self_partial=partial,
                           **context)
    if fragment and g.get("read_source") is not None:
        # A polled fragment updates the page's read-source line too (out of band).
        body += render_template("partials/_read_source.html", oob=True)
    response = make_response(body, status)
    response.vary.add("HX-Request")
    response.headers["Cache-Control"] = "no-store"
    return response


def ago(seconds: float | None) -> str:
    """Return a short human duration: 45s, 12m, 3h 5m, 2d 4h."""
    if seconds is None:
        return "—"
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def ts(moment: datetime | None) -> str:
    """Return a compact UTC timestamp in a `<time datetime=…>` and its age ("5m 3s ago").

    Every page and every filter speaks UTC, so a copied time means the same everywhere;
    static/ledger.js puts the browser's local time in the tooltip only.
    """
    if moment is None:
        return "—"
    text = moment.strftime("%Y-%m-%d %H:%M:%S") + "Z"
    now = current_app.extensions["ledger"].clock.now()
    seconds = (now - moment).total_seconds()
    age = f"{ago(seconds)} ago" if seconds >= 0 else f"in {ago(-seconds)}"
    return Markup('<time datetime="{}">{}</time> <span class="age">({})</span>').format(
        moment.isoformat(), text, age)


def _template_context() -> dict[str, Any]:
    """Expose the operator and a role check to every template."""
    operator = g.get("operator")
    return {"operator": operator, "query_without": query_without,
            "can": (lambda role: operator is not None and operator.can(role))}


def query_without(*names: str) -> str:
    """Return the request's query string without the named arguments (for paging links)."""
    kept = [(k, v) for k, v in request.args.items(multi=True) if k not in names and v]
    return urlencode(kept)


def register_dashboard(app: Flask) -> None:
    """Install security (sessions, CSRF), the dashboard pages and the JSON API."""
    from ledger.web import api, openapi
    from ledger.web.dashboard import (  # noqa: F401  (routes on import)
        actions,
        admin,
        connect,
        deliveries,
        destinations,
        drill_page,
        evidence,
        export,
        groups,
        health,
        keys,
        pages,
        search,
    )

    init_security(app)
    app.jinja_env.filters["ago"] = ago
    app.jinja_env.filters["ts"] = ts
    app.context_processor(_template_context)
    app.register_blueprint(bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(openapi.bp)
