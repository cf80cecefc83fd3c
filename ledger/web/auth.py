"""Who is asking: login/logout, server-side sessions, API tokens, roles and CSRF."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_wtf.csrf import CSRFProtect
from werkzeug.wrappers import Response as BaseResponse

from ledger.access import audit
from ledger.access.operators import (
    HashingBusy,
    Operator,
    operator_for_token,
    password_hash_of,
    verify_login_password,
    verify_password,
)
from ledger.access.sessions import (
    BUSY_RETRY_SECONDS,
    LoginBusy,
    SessionPolicy,
    clear_login,
    end_session,
    load_session,
    reserve_login,
    reserve_reentry,
    settle_reentry,
    start_session,
)
from ledger.services import Services
from ledger.web.errors import wants_json
from ledger.web.input_guard import is_unsafe_text

bp = Blueprint("auth", __name__)
csrf = CSRFProtect()
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_METHODS = frozenset({"GET", "HEAD"})
WRONG_PASSWORD = "Your password did not match; nothing was changed."
TOO_MANY_REENTRIES = ("Too many wrong passwords in this session: it has ended, sign in "
                      "again. Nothing was changed.")
NEEDS_SESSION = "This action needs a signed-in session and your password."


def services() -> Services:
    """Return this app's services."""
    svc: Services = current_app.extensions["ledger"]
    return svc


def init_security(app: Flask) -> None:
    """Configure the session cookie and CSRF checks for the whole app."""
    settings = app.extensions["ledger"].settings
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.cookie_secure, SESSION_COOKIE_NAME="ledger_session",
        PERMANENT_SESSION_LIFETIME=timedelta(seconds=settings.session_absolute_seconds),
        # Checked in _csrf_guard below, so the two exemptions are visible in one place.
        WTF_CSRF_CHECK_DEFAULT=False, WTF_CSRF_TIME_LIMIT=None)
    csrf.init_app(app)
    app.before_request(_csrf_guard)
    app.register_blueprint(bp)


def _csrf_guard() -> BaseResponse | None:
    """Check every state-changing request: CSRF for sessions, the write scope for tokens."""
    if request.blueprint == "ingest" or request.path.startswith("/hooks/"):
        return None  # senders authenticate by signature and carry no cookie
    if _bearer_token() is not None:
        # A token in a header is not sent by a browser on its own, so it needs no CSRF
        # token; but only a live token with the write scope may use any method but
        # GET and HEAD.
        if request.method in READ_METHODS:
            return None
        operator = authenticate()
        if operator is None:
            return unauthenticated()
        if "write" not in (operator.token_scopes or ()):
            return token_forbidden()
        return None
    if request.method in UNSAFE_METHODS:
        # Authentication first: a form posted after the session ended is a 401 with the
        # way back to login, not a 400 about a CSRF token that ended with it.
        if request.blueprint != "auth" and authenticate() is None:
            return unauthenticated()
        csrf.protect()
    return None


def _bearer_token() -> str | None:
    """Return the Bearer token of the request, if any."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def policy(svc: Services) -> SessionPolicy:
    """Return the session timeouts from settings."""
    return SessionPolicy(idle_seconds=svc.settings.session_idle_seconds,
                         absolute_seconds=svc.settings.session_absolute_seconds)


def authenticate() -> Operator | None:
    """Identify the caller by Bearer token or session cookie; cache it on `g`."""
    if "operator" in g:
        cached: Operator | None = g.operator
        return cached
    svc = services()
    token = _bearer_token()
    operator = None
    with svc.engine.begin() as conn:
        if token is not None:
            operator = operator_for_token(conn, token, svc.clock.now())
        elif session.get("sid"):
            operator = load_session(conn, session["sid"], svc.clock.now(), policy(svc))
    if operator is None and token is None and session.pop("sid", None):
        g.session_ended = True
    g.operator = operator
    return operator


def unauthenticated() -> BaseResponse:
    """Answer a request without a valid session or token: 401 JSON or a redirect to login."""
    if wants_json() or _bearer_token() is not None:
        response = jsonify({"error": "unauthenticated"})
        response.status_code = 401
        response.headers["WWW-Authenticate"] = 'Bearer realm="ledger"'
        return response
    htmx = bool(request.headers.get("HX-Request"))
    # An htmx request comes from a page that was signed in: its session has ended.
    ended = htmx or bool(g.get("session_ended"))
    target = url_for("auth.login", next=_page_of_request(htmx))
    if ended:
        target += "&expired=1"
    if htmx:
        response = Response("", status=401)
        response.headers["HX-Redirect"] = target
        return response
    return redirect(target, code=302)


def _page_of_request(htmx: bool) -> str:
    """Return where to come back after login: the page shown, not a fragment or a POST URL."""
    if not htmx and request.method in READ_METHODS:
        return request.full_path.rstrip("?")
    shown = request.headers.get("HX-Current-URL") or request.headers.get("Referer") or ""
    parts = urlsplit(shown)
    if parts.netloc == request.host and parts.path.startswith("/"):
        return parts.path + (f"?{parts.query}" if parts.query else "")
    return url_for("dashboard.overview")


def token_forbidden() -> Response:
    """Answer what no API token may do (CONTRACT section 7): 403, nothing changes."""
    response = jsonify({"error": "forbidden"})
    response.status_code = 403
    return response


def forbidden(needed: str) -> Response:
    """Answer an action the caller's role does not allow."""
    if wants_json() or _bearer_token() is not None:
        response = jsonify({"error": "forbidden", "needed_role": needed})
        response.status_code = 403
        return response
    body = render_template("error.html", status=403, title="Not allowed",
                           message=f"This needs the {needed} role or higher.")
    return Response(body, status=403)


def require_login() -> BaseResponse | None:
    """Blueprint hook: stop requests without an operator."""
    return unauthenticated() if authenticate() is None else None


def requires(role: str, *, session_only: bool = False
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a view so it runs only for operators holding `role` or higher.

    `session_only`: no API token, whatever its scopes, reaches the view (credentials,
    operators and tokens are managed from a session with the password, or the CLI).
    """

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            operator = authenticate()
            if operator is None:
                return unauthenticated()
            if session_only and operator.token_scopes is not None:
                return token_forbidden()
            if not operator.can(role):
                return forbidden(role)
            return view(*args, **kwargs)

        # Read by tests that walk the URL map: which views no token may reach.
        wrapper.session_only = session_only  # type: ignore[attr-defined]
        return wrapper

    return decorate


def actor() -> audit.Actor:
    """Return the audit actor of the current operator."""
    operator: Operator = g.operator
    # The request id request_log bound for this request: sanitised, the one in the logs.
    return audit.Actor(name=operator.username, role=operator.role, request_id=g.request_id,
                       client=client_address())


def client_address() -> str:
    """Return the client address (ProxyFix has applied LEDGER_TRUSTED_PROXIES to it)."""
    return request.remote_addr or "unknown"


def confirm_password(password: str) -> str | None:
    """Re-check the session operator's password; None when it matched, else why not.

    Counted per session (README "Login limits"), never against login failures: those are
    made by anyone, and must not keep a logged-in operator from revoking a key.
    """
    svc = services()
    operator: Operator = g.operator
    session_id = session.get("sid")
    if not session_id or operator.token_scopes is not None:
        return NEEDS_SESSION
    limit = svc.settings.login_max_failures
    with svc.engine.begin() as conn:
        reserved = reserve_reentry(conn, session_id, limit)
        _, stored = password_hash_of(conn, operator.username)
    if not reserved:
        return TOO_MANY_REENTRIES
    ok = bool(password) and verify_password(stored, password)
    with svc.engine.begin() as conn:
        ended = settle_reentry(conn, session_id, ok, svc.clock.now(), limit)
    if ok:
        return None
    return TOO_MANY_REENTRIES if ended else WRONG_PASSWORD


def _safe_next(target: str | None) -> str:
    """Return a local path to go to after login (never another host)."""
    if not target:
        return url_for("dashboard.overview")
    parts = urlsplit(target)
    # A control character or a backslash would end up in the Location header or be read
    # as another host by a browser: such a target is not a local path.
    if (parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//")
            or "\\" in target or is_unsafe_text(target)):
        return url_for("dashboard.overview")
    return target


@bp.get("/login")
def login() -> str:
    """Show the login form."""
    return render_template("login.html", next=request.args.get("next", ""), error=None,
                           expired=request.args.get("expired") == "1")


@bp.post("/login")
def login_submit() -> BaseResponse:
    """Check the password (rate limited per username and address) and start a new session."""
    svc = services()
    username = request.form.get("username", "").strip()
    password = request.form.get("password", "")
    window, limit = svc.settings.login_window_seconds, svc.settings.login_max_failures
    try:
        with svc.engine.begin() as conn:
            # Counts as a failure from here until the password proves right (atomic).
            wait = reserve_login(conn, username, client_address(), svc.clock.now(), window,
                                 limit)
            operator, stored = password_hash_of(conn, username)
    except LoginBusy:
        return _login_error(429, f"Other sign-ins for {username!s} from your address are "
                                 "being checked. Try again in a few seconds.",
                            retry_after=BUSY_RETRY_SECONDS)
    if wait:
        minutes = max(1, (wait + 59) // 60)
        return _login_error(429, f"Too many failed sign-ins for {username!s}. "
                                 f"Try again in {minutes} minute"
                                 f"{'s' if minutes != 1 else ''}.", retry_after=wait)
    try:
        ok = verify_login_password(stored, password) and operator is not None and bool(password)
    except HashingBusy:
        return _login_error(503, "Many sign-ins are being checked. Try again in a few seconds.",
                            retry_after=BUSY_RETRY_SECONDS)
    if not ok or operator is None:  # the failure was recorded with the reservation above
        return _login_error(401, "Wrong username or password.")
    target = _safe_next(request.form.get("next"))  # before anything is written
    with svc.engine.begin() as conn:
        clear_login(conn, username, client_address())
        if session.get("sid"):  # logging in again replaces the old session
            end_session(conn, session["sid"], svc.clock.now())
        session_id = start_session(conn, operator, svc.clock.now())
    # A fresh cookie: nothing from before login (including its CSRF token) survives.
    session.clear()
    session.permanent = True
    session["sid"] = session_id
    return redirect(target, code=303)


def _login_error(status: int, message: str, retry_after: int | None = None) -> Response:
    """Render the login form again with an error."""
    body = render_template("login.html", next=request.form.get("next", ""), error=message,
                           username=request.form.get("username", ""))
    response = Response(body, status=status)
    if retry_after:
        response.headers["Retry-After"] = str(retry_after)
    return response


@bp.post("/logout")
def logout() -> BaseResponse:
    """End the session on the server and drop the cookie."""
    svc = services()
    if session.get("sid"):
        with svc.engine.begin() as conn:
            end_session(conn, session["sid"], svc.clock.now())
    session.clear()
    return redirect(url_for("auth.login"), code=303)
