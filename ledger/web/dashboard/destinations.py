"""The destinations page: state, success rate, p95 latency, backlog, latest failures, and
pause/resume (`oncall` and up, with a reason, CSRF-checked, audited)."""

from __future__ import annotations

from typing import Any

from flask import Response, g, request

from ledger.destinations.store import DestinationState, set_destination_state
from ledger.errors import LedgerError
from ledger.reads.destinations import hide_responses, read_destinations
from ledger.web.auth import actor, requires, services
from ledger.web.dashboard import bp, render
from ledger.web.dashboard.actions import status_of
from ledger.web.read_source import primary_read, replica_read

_STATES = {"pause": DestinationState.PAUSED, "resume": DestinationState.ACTIVE}


def visible_destinations(reader: Any = replica_read) -> list[dict[str, Any]]:
    """Read the destinations; response excerpts only for roles that may see payloads."""
    now = services().clock.now()
    items: list[dict[str, Any]] = reader(lambda conn: read_destinations(conn, now))
    return items if g.operator.can("oncall") else hide_responses(items)


@bp.get("/destinations")
@requires("viewer")
def destinations_page() -> Response:
    """Every destination with its health; pause and resume for oncall and up."""
    return render("destinations.html", "partials/_destinations.html",
                  destinations=visible_destinations(), message=None, ok=True)


@bp.post("/destinations/<public_id>/state")
@requires("oncall")
def destination_state(public_id: str) -> Response:
    """Pause or resume a destination with a reason (audited)."""
    svc = services()
    action = request.form.get("action", "")
    status, ok = 200, True
    if action not in _STATES:
        status, ok, message = 400, False, "choose pause or resume"
    else:
        try:
            with svc.engine.begin() as conn:
                changed = set_destination_state(conn, actor(), public_id, _STATES[action],
                                                reason=request.form.get("reason", ""),
                                                now=svc.clock.now())
            message = f"{changed.public_id} is {changed.state.value}."
        except LedgerError as error:
            status, ok, message = status_of(error), False, str(error)
    return render("destinations.html", "partials/_destinations.html", status=status,
                  destinations=visible_destinations(primary_read), message=message, ok=ok)
