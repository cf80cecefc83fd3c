"""The header search box: lands on the one page the query names, or lists the candidates."""

from __future__ import annotations

from flask import redirect, request, url_for
from werkzeug.wrappers import Response

from ledger.reads.search import Hit, search
from ledger.web.auth import requires
from ledger.web.dashboard import bp, render
from ledger.web.read_source import replica_read


def hit_url(hit: Hit) -> str:
    """Return the page a hit lands on."""
    if hit.kind == "receipt":
        return url_for("dashboard.receipt_page", public_id=hit.public_id, event_id=hit.event_id)
    if hit.kind == "delivery":
        return url_for("dashboard.deliveries_page", integration=hit.scope, event_id=hit.event_id)
    return url_for("dashboard.receipts_page", scope=hit.scope)


@bp.get("/search")
@requires("viewer")
def search_page() -> Response:
    """Find an event id in every scope, an account, an integration slug or public id."""
    q = request.args.get("q", "")
    hits = replica_read(lambda conn: search(conn, q))
    if len(hits) == 1:
        response = redirect(hit_url(hits[0]), code=303)
        response.headers["Cache-Control"] = "no-store"
        return response
    return render("search.html", status=200 if hits or not q.strip() else 404, q=q.strip(),
                  hits=[(hit, hit_url(hit)) for hit in hits])
