"""Operator administration (admin role): accounts, roles, API tokens."""

from __future__ import annotations

import secrets
from typing import Any

from flask import Response, request

from ledger.access.operators import (
    ROLES,
    create_operator,
    disable_operator,
    issue_token,
    list_operators,
    set_role,
)
from ledger.errors import LedgerError, NotFound
from ledger.web.auth import actor, requires, services
from ledger.web.dashboard import bp, render


def _answer(*, status: int = 200, shown_once: dict[str, Any] | None = None,
            message: str | None = None, error: str | None = None) -> Response:
    """Render the operators list with a one-time secret or a message."""
    with services().engine.connect() as conn:
        rows = list_operators(conn)
    return render("operators.html", "partials/_operators.html", status=status,
                  operators=rows, roles=ROLES, shown_once=shown_once, message=message,
                  error=error)


@bp.get("/operators")
@requires("admin")
def operators_page() -> Response:
    """Operators and their roles."""
    return _answer()


@bp.post("/operators")
@requires("admin")
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
@requires("admin")
def operator_role(username: str) -> Response:
    """Change an operator's role (their sessions end)."""
    svc = services()
    try:
        with svc.engine.begin() as conn:
            set_role(conn, actor(), username, request.form.get("role", ""),
                     reason=request.form.get("reason", "").strip() or "role change",
                     now=svc.clock.now())
    except LedgerError as error:
        return _answer(status=404 if isinstance(error, NotFound) else 409, error=str(error))
    return _answer(message=f"{username} is now {request.form.get('role')}.")


@bp.post("/operators/<username>/disable")
@requires("admin")
def operator_disable(username: str) -> Response:
    """Disable an operator: sessions end, tokens stop working."""
    svc = services()
    try:
        with svc.engine.begin() as conn:
            disable_operator(conn, actor(), username,
                             reason=request.form.get("reason", "").strip() or "disabled",
                             now=svc.clock.now())
    except LedgerError as error:
        return _answer(status=404 if isinstance(error, NotFound) else 409, error=str(error))
    return _answer(message=f"{username} is disabled.")


@bp.post("/operators/<username>/token")
@requires("admin")
def operator_token(username: str) -> Response:
    """Issue an API token for an operator, shown once."""
    svc = services()
    try:
        with svc.engine.begin() as conn:
            token = issue_token(conn, actor(), username, now=svc.clock.now())
    except LedgerError as error:
        return _answer(status=404 if isinstance(error, NotFound) else 409, error=str(error))
    return _answer(shown_once={"label": f"API token of {username}", "value": token},
                   message=f"Issued an API token for {username}.")
