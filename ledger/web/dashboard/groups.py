"""Failure groups: the failures page grouped by event type and error signature.

Requeueing a group reuses the bulk requeue (ledger.web.dashboard.actions) with the
group's id as one more filter; acknowledging or muting it is an audited action.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Response, request
from sqlalchemy import Connection

from ledger.errors import LedgerError
from ledger.reads import BadCursor
from ledger.reads.groups import read_groups
from ledger.web.auth import actor, requires, services
from ledger.web.dashboard import bp, render
from ledger.web.dashboard.actions import status_of
from ledger.web.filters import BadFilter, receipt_filter
from ledger.web.read_source import primary_read, replica_read
from ledger.worker.failure_review import GroupState, review_group

FILTER_KEYS = ("scope", "event_type", "since", "until")


def groups_context(args: Any, reader: Callable[..., Any] = replica_read) -> dict[str, Any]:
    """Group the failures matching the request's filters; errors become a message.

    `reader`: replica_read for the page, primary_read right after a review.
    """

    def read(conn: Connection) -> Any:
        return read_groups(conn, receipt_filter(conn, args))

    try:
        view = reader(read)
    except (BadFilter, BadCursor) as error:
        return {"error": str(error), "view": None}
    return {"error": None, "view": view}


def _filters(args: Any) -> dict[str, str]:
    """Return the filter arguments a group's forms carry along."""
    return {k: args.get(k, "") for k in FILTER_KEYS}


@bp.get("/failures/groups")
@requires("viewer")
def failures_groups() -> Response:
    """Terminal failures grouped by event type and error signature; requeue, ack or mute."""
    context = groups_context(request.args)
    return render("failure_groups.html", "partials/_failure_groups.html",
                  status=400 if context["error"] else 200, args=request.args,
                  filters=_filters(request.args), message=None, **context)


_VERDICTS = {"acknowledge": GroupState.ACKNOWLEDGED, "mute": GroupState.MUTED, "clear": None}


@bp.post("/failures/groups/review")
@requires("oncall")
def failures_groups_review() -> Response:
    """Acknowledge, mute or clear a failure group with a note (audited)."""
    svc = services()
    form = request.form
    verdict = form.get("verdict", "")
    status, message = 200, None
    if verdict not in _VERDICTS:
        status, message = 400, "choose acknowledge, mute or clear"
    else:
        try:
            with svc.engine.begin() as conn:
                review_group(conn, actor(), event_type=form.get("group_event_type", ""),
                             signature=form.get("group_signature", ""),
                             state=_VERDICTS[verdict],
                             note=form.get("note", ""), now=svc.clock.now())
            message = {"acknowledge": "Group acknowledged.", "mute": "Group muted.",
                       "clear": "Group cleared: no longer acknowledged or muted."}[verdict]
        except LedgerError as error:
            status, message = status_of(error), str(error)
    filters = {k: form.get(k, "") for k in FILTER_KEYS}
    context = groups_context(filters, primary_read)
    return render("failure_groups.html", "partials/_failure_groups.html", status=status,
                  args=filters, filters=_filters(filters), message=message,
                  review_error=status != 200, **context)
