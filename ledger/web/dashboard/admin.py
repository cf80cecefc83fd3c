"""Operator administration (admin role): accounts, roles, API tokens.

Every form here needs a session and the admin's password again: no API token,
whatever its scopes, manages operators or tokens (CONTRACT section 7).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any, ParamSpec

from flask import Response, request

from ledger.access.operators import (
    DEFAULT_TOKEN_SECONDS,
    ROLES,
    create_operator,
    disable_operator,
    issue_token,
    list_operators,
    list_tokens,
    revoke_token,
    set_role,
)
from ledger.errors import LedgerError, NotFound
from ledger.web.auth import actor, confirm_password, requires, services
from ledger.web.dashboard import bp, render

P = ParamSpec("P")
TOKEN_LIFETIMES = ((86400, "1 day"), (7 * 86400, "7 days"), (30 * 86400, "30 days"),
                   (DEFAULT_TOKEN_SECONDS, "90 days"), (365 * 86400, "365 days"))


def _answer(*, status: int = 200, shown_once: dict[str, Any] | None = None,
            message: str | None = None, error: str | None = None) -> Response:
    """Render the operators and tokens lists with a one-time secret or a message."""
    with services().engine.connect() as conn:
        rows = list_operators(conn)
        tokens = list_tokens(conn)
    return render("operators.html", "partials/_operators.html", status=status,
                  operators=rows, roles=ROLES, tokens=tokens, lifetimes=TOKEN_LIFETIMES,
                  default_lifetime=DEFAULT_TOKEN_SECONDS, shown_once=shown_once,
                  message=message, error=error)


def _with_password(view: Callable[P, Response]) -> Callable[P, Response]:
    """Run the view only after the admin entered their password again (403 otherwise)."""

    @functools.wraps(view)
    def confirmed(*args: P.args, **kwargs: P.kwargs) -> Response:
        refused = confirm_password(request.form.get("password", ""))
        if refused:
            return _answer(status=403, error=refused)
        return view(*args, **kwargs)

    return confirmed


def _refused(error: LedgerError) -> Response:
    """Answer a refused or missing record."""
    return _answer(status=404 if isinstance(error, NotFound) else 409, error=str(error))


@bp.get("/operators")
@requires("admin")
def operators_page() -> Response:
    """Operators, their roles and their API tokens."""
    return _answer()


@bp.post("/operators")
@requires("admin", session_only=True)
@_with_password
def operator_create() -> Response:
    """Create an operator with a generated password, shown once."""
    svc = services()
    username, role = request.form.get("username", "").strip(), request.form.get("role", "")
    password = secrets.token_urlsafe(18)
    try:
        with svc.engine.begin() as conn:
            create_operator(conn, actor(), username=username, role=role, password=password,
                            now=svc.clock.now())
    except LedgerError as error:
        return _answer(status=409, error=str(error))
    return _answer(shown_once={"label": f"Password of {username}", "value": password},
                   message=f"Created {username} ({role}).")


@bp.post("/operators/<username>/role")
@requires("admin", session_only=True)
@_with_password
def operator_role(username: str) -> Response:
    """Change an operator's role (their sessions end)."""
    svc = services()
    try:
        with svc.engine.begin() as conn:
            set_role(conn, actor(), username, request.form.get("role", ""),
                     reason=request.form.get("reason", "").strip() or "role change",
                     now=svc.clock.now())
    except LedgerError as error:
        return _refused(error)
    return _answer(message=f"{username} is now {request.form.get('role')}.")


@bp.post("/operators/<username>/disable")
@requires("admin", session_only=True)
@_with_password
def operator_disable(username: str) -> Response:
    """Disable an operator: sessions end, tokens stop working."""
    svc = services()
    try:
        with svc.engine.begin() as conn:
            disable_operator(conn, actor(), username,
                             reason=request.form.get("reason", "").strip() or "disabled",
                             now=svc.clock.now())
    except LedgerError as error:
        return _refused(error)
    return _answer(message=f"{username} is disabled.")


@bp.post("/operators/<username>/token")
@requires("admin", session_only=True)
@_with_password
def operator_token(username: str) -> Response:
    """Issue an API token for an operator (read-only unless `write`), shown once."""
    svc = services()
    try:
        expires_in = int(request.form.get("expires_in", DEFAULT_TOKEN_SECONDS))
        with svc.engine.begin() as conn:
            issued = issue_token(conn, actor(), username, now=svc.clock.now(),
                                 write=request.form.get("write") == "1",
                                 expires_in=expires_in)
    except ValueError:
        return _answer(status=400, error="expires_in must be seconds")
    except LedgerError as error:
        return _refused(error)
    return _answer(shown_once={"label": f"API token of {username} ({issued.token_id}, "
                                        f"{' '.join(issued.scopes)})", "value": issued.token},
                   message=f"Issued {issued.token_id} for {username}, expiring "
                           f"{issued.expires_at:%Y-%m-%d %H:%M}Z.")


@bp.post("/tokens/<token_id>/revoke")
@requires("admin", session_only=True)
@_with_password
def token_revoke(token_id: str) -> Response:
    """Revoke one API token: it answers 401 from then on."""
    svc = services()
    try:
        with svc.engine.begin() as conn:
            revoke_token(conn, actor(), token_id, now=svc.clock.now())
    except LedgerError as error:
        return _refused(error)
    return _answer(message=f"Revoked {token_id}.")
