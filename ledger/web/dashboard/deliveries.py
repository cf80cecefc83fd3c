"""The Deliveries page: the delivery log, filtered and keyset-paged; reasons for security."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flask import Response, g, request

from ledger.reads import BadCursor
from ledger.reads.deliveries import OUTCOMES, list_deliveries, refusal_category
from ledger.reads.models import DeliveryItem
from ledger.web.auth import requires, services
from ledger.web.dashboard import bp, render
from ledger.web.filters import BadFilter, delivery_filter, page_size
from ledger.web.read_source import replica_read


def deliveries_context(args: Any) -> dict[str, Any]:
    """Run the delivery log query for the request's filters; errors become a message."""
    try:
        page = replica_read(lambda conn: list_deliveries(
            conn, delivery_filter(conn, args), cursor=args.get("cursor") or None,
            limit=page_size(args)))
    except (BadFilter, BadCursor) as error:
        return {"error": str(error), "page": None}
    page.items[:] = visible_rows(page.items)
    return {"error": None, "page": page}


class DeliveryRow(DeliveryItem):
    """A delivery as the pages show it: with its refusal category for oncall and up."""

    category: str | None


def visible_rows(items: Sequence[DeliveryItem]) -> list[DeliveryRow]:
    """Give each row its refusal category (oncall and up); blank the reason below security."""
    security, oncall = g.operator.can("security"), g.operator.can("oncall")
    return [{**item,
             "category": refusal_category(item["outcome"], item["reason"]) if oncall else None,
             "reason": item["reason"] if security else None} for item in items]


@bp.get("/deliveries")
@requires("viewer")
def deliveries_page() -> Response:
    """Every request to /hooks/: accepted, duplicate, conflict and each refusal, with its key."""
    context = deliveries_context(request.args)
    return render("deliveries.html", "partials/_deliveries.html",
                  status=400 if context["error"] else 200, args=request.args,
                  outcomes=OUTCOMES, log_on=services().settings.delivery_log, **context)
