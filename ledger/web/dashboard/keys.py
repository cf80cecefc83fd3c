"""“Which key is this secret?”: security pastes a leaked secret and learns its key id.

The secret is compared by its keyed fingerprint (ledger.access.secrets_box), after the
operator's password is entered again; the lookup is audited (who, when, which key
matched), the secret is never stored, logged or shown back.
"""

from __future__ import annotations

from typing import Any

from flask import Response, request
from sqlalchemy import Connection, select

from ledger.access.credentials import identify_secret
from ledger.db.schema import credentials, integrations
from ledger.errors import LedgerError
from ledger.web.auth import actor, confirm_password, requires, services
from ledger.web.dashboard import bp, render


@bp.post("/credentials/identify")
@requires("security", session_only=True)
def identify_key() -> Response:
    """Answer which credential a pasted secret belongs to (password re-entry, audited)."""
    refused = confirm_password(request.form.get("password", ""))
    if refused:
        return render("action.html", "partials/_identify_result.html", status=403,
                      error=refused, matched=None)
    svc = services()
    try:
        with svc.engine.begin() as conn:
            matched = identify_secret(conn, actor(), request.form.get("secret", ""),
                                      now=svc.clock.now())
            labels = credential_labels(conn, matched)
    except LedgerError as error:
        return render("action.html", "partials/_identify_result.html", status=400,
                      error=str(error), matched=None)
    return render("action.html", "partials/_identify_result.html", error=None,
                  matched=labels)


def credential_labels(conn: Connection, key_ids: list[str]) -> list[dict[str, Any]]:
    """Return each matched key with its scope, state and label."""
    if not key_ids:
        return []
    rows = conn.execute(
        select(credentials.c.key_id, credentials.c.state, credentials.c.label,
               integrations.c.public_id, integrations.c.account, integrations.c.name)
        .join(integrations, integrations.c.id == credentials.c.integration_id)
        .where(credentials.c.key_id.in_(key_ids)))
    return [dict(r._mapping, scope=f"{r.account}/{r.name}") for r in rows]
