"""Connecting a sender from the dashboard (security role): the CLI's `integration create`."""

from __future__ import annotations

from flask import Response, request

from ledger.access.integrations import create_integration, profile_settings
from ledger.errors import LedgerError
from ledger.intake.signatures.configurable import OPTION_NAMES as HMAC_OPTIONS
from ledger.intake.signatures.token_profile import OPTION_NAMES as TOKEN_OPTIONS
from ledger.web.auth import actor, confirm_password, requires, services
from ledger.web.dashboard import bp
from ledger.web.dashboard.actions import credentials_answer
from ledger.web.dashboard.pages import integrations_answer

FORM_OPTIONS = {"hmac": ("hmac_", HMAC_OPTIONS), "token": ("tok_", TOKEN_OPTIONS)}


def _field(name: str) -> str | None:
    """Return a stripped form field, None when empty."""
    return (request.form.get(name) or "").strip() or None


@bp.post("/credentials/connect")
@requires("security", session_only=True)
def integration_connect() -> Response:
    """Create an integration and its first credential after re-entering the password.

    A new credential is a way in for whoever chose its secret, so it needs what adding a
    key needs (CONTRACT section 7): a session and the password, never a token.
    """
    svc = services()
    refused = confirm_password(request.form.get("password", ""))
    if refused:
        return integrations_answer(status=403, error=refused)
    profile = _field("profile") or ""
    # The option fields of the chosen profile only (hmac_… or tok_… in the form).
    prefix, names = FORM_OPTIONS.get(profile, ("", ()))
    options = {name: _field(prefix + name) for name in names}
    options = {name: value for name, value in options.items() if value}
    try:
        tolerance = int(_field("tolerance") or 300)
        settings = profile_settings(profile, type_path=_field("type_path"),
                                    event_type=_field("event_type"),
                                    endpoint_url=_field("url"), hmac_options=options or None)
        with svc.engine.begin() as conn:
            integration, created = create_integration(
                conn, svc.box, actor(), account=_field("account") or "",
                name=_field("name") or "", profile=profile, now=svc.clock.now(),
                tolerance=tolerance, secret=_field("secret"), settings=settings)
    except ValueError:
        return integrations_answer(status=400, error="tolerance must be whole seconds")
    except LedgerError as error:
        return integrations_answer(status=400, error=str(error))
    svc.view.invalidate()
    shown = {"key_id": created.key_id, "secret": created.shown_secret}
    return credentials_answer(integration.public_id, secret=shown if not created.public
                               else None,
                               message=f"Connected {integration.scope} ({profile}): "
                                       f"POST /hooks/{integration.public_id}")
