"""An integration's delivery health over 24 hours and 7 days (server-rendered SVG).

Three charts per window: accepted with the failed share, refusals, and the p95
intake latency read from the hourly latency histograms (ledger/reads/health.py).
"""

from __future__ import annotations

import math
from typing import Any

from flask import Response, abort
from markupsafe import Markup
from sqlalchemy import Connection

from ledger.access.integrations import get_integration
from ledger.db.schema import LATENCY_BOUNDS_US
from ledger.domain import Integration
from ledger.errors import NotFound
from ledger.reads.health import Health, Window, read_health
from ledger.web.auth import requires, services
from ledger.web.dashboard import bp, render
from ledger.web.dashboard.svg import LATENCY_COLOUR, REFUSED_COLOUR, value_bars, volume_bars
from ledger.web.read_source import replica_read


def latency_text(p95: float | None) -> str:
    """Return a p95 as the page says it: its bucket's upper bound, or past the last one."""
    if p95 is None:
        return "no answered deliveries"
    if math.isinf(p95):
        return f"p95 > {LATENCY_BOUNDS_US[-1] / 1000:g} ms"
    return f"p95 \u2264 {p95:g} ms"


def _charts(window: Window, fmt: str) -> list[Markup]:
    """Return the volume, refusals and latency charts of one window."""
    slots = window.slots
    return [
        volume_bars([(s.start, s.accepted, s.failed) for s in slots], label=window.label,
                    fmt=fmt),
        value_bars([(s.start, float(s.refused), f"{s.refused} refused") for s in slots],
                   label=f"refusals, {window.label}", colour=REFUSED_COLOUR, fmt=fmt),
        value_bars([(s.start, s.p95_ms, f"{latency_text(s.p95_ms)} ({s.answered} answered)")
                    for s in slots], label=f"p95 intake latency, {window.label}",
                   colour=LATENCY_COLOUR, fmt=fmt),
    ]


@bp.get("/credentials/<public_id>/health")
@requires("viewer")
def integration_health(public_id: str) -> Response:
    """Accepted, failed, refused and p95 latency per hour (24 h) and per day (7 days)."""
    svc = services()

    def read(conn: Connection) -> tuple[Integration, Health]:
        integration = get_integration(conn, public_id)
        return integration, read_health(conn, integration.id, svc.clock.now())

    try:
        integration, health = replica_read(read)
    except NotFound:
        abort(404)
    charts: list[tuple[Window, Any]] = [(health.day, _charts(health.day, "%H:%M")),
                                        (health.week, _charts(health.week, ""))]
    return render("health.html", "partials/_health.html", integration=integration,
                  health=health, charts=charts, latency_text=latency_text,
                  bounds_ms=[b / 1000 for b in LATENCY_BOUNDS_US], now=svc.clock.now())
