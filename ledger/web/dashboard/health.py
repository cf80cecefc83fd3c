"""An integration's delivery health: success rate and volume over 24 hours and 7 days (SVG)."""

from __future__ import annotations

from flask import Response, abort
from sqlalchemy import Connection

from ledger.access.integrations import get_integration
from ledger.domain import Integration
from ledger.errors import NotFound
from ledger.reads.health import Health, read_health
from ledger.web.auth import requires, services
from ledger.web.dashboard import bp, render
from ledger.web.dashboard.svg import volume_bars
from ledger.web.read_source import replica_read


@bp.get("/credentials/<public_id>/health")
@requires("viewer")
def integration_health(public_id: str) -> Response:
    """Accepted and failed per hour (24 h) and per day (7 days), from the rollup."""
    svc = services()

    def read(conn: Connection) -> tuple[Integration, Health]:
        integration = get_integration(conn, public_id)
        return integration, read_health(conn, integration.id, svc.clock.now())

    try:
        integration, health = replica_read(read)
    except NotFound:
        abort(404)
    charts = [(health.day, volume_bars(health.day.buckets, label=health.day.label)),
              (health.week, volume_bars(health.week.buckets, label=health.week.label,
                                        fmt=""))]
    return render("health.html", "partials/_health.html", integration=integration,
                  health=health, charts=charts, now=svc.clock.now())
