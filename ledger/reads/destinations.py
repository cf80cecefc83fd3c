"""Destinations as the dashboard and /api/v1/destinations show them (never a secret).

Per destination: its settings and state, and from its recent answered attempts the
success rate, the p95 latency and the latest failures (a request still open, or whose
worker died before it recorded the answer, is `sending`: only a receipt's answers show
it); its backlog is its integration's queued work items of the types it takes, counted up to
BACKLOG_CAP.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select

from ledger.db.schema import destination_attempts, integrations, jobs
from ledger.destinations.store import SENDING, Destination, list_destinations
from ledger.domain import JobStatus
from ledger.reads.models import DestinationAnswer, DestinationFailure

WINDOW_SECONDS = 24 * 3600
# The rate and p95 are computed over at most this many of the newest attempts in the
# window: enough for a stable p95, bounded however busy the destination is.
SAMPLE_LIMIT = 2000
BACKLOG_CAP = 10_000
FAILURES_SHOWN = 5


def p95(values: list[float]) -> float | None:
    """Return the 95th percentile (nearest rank) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _stats(conn: Connection, destination_id: int, since: datetime) -> dict[str, Any]:
    """Return the attempts sampled, their success rate and p95 latency since `since`."""
    rows = conn.execute(
        select(destination_attempts.c.outcome, destination_attempts.c.latency_ms)
        .where(destination_attempts.c.destination_id == destination_id,
               destination_attempts.c.started_at >= since,
               destination_attempts.c.outcome != SENDING)  # answered attempts only
        .order_by(destination_attempts.c.started_at.desc()).limit(SAMPLE_LIMIT)).all()
    ok = sum(1 for r in rows if r.outcome == "complete")
    return {"attempts_sampled": len(rows),
            "success_rate": round(ok / len(rows), 4) if rows else None,
            "p95_latency_ms": p95([r.latency_ms for r in rows])}


def _backlog(conn: Connection, destination: Destination) -> int:
    """Return how many of the destination's events wait in the queue (up to BACKLOG_CAP)."""
    terms = [jobs.c.scope_id == destination.integration_id,
             jobs.c.status == JobStatus.QUEUED.value]
    if destination.event_types is not None:
        terms.append(jobs.c.event_type.in_(destination.event_types))
    capped = select(jobs.c.event_id).where(*terms).limit(BACKLOG_CAP).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def recent_failures(conn: Connection, destination_id: int, *,
                    limit: int = FAILURES_SHOWN) -> list[DestinationFailure]:
    """Return the destination's latest attempts that did not complete, newest first."""
    rows = conn.execute(
        select(destination_attempts)
        .where(destination_attempts.c.destination_id == destination_id,
               destination_attempts.c.outcome.not_in(("complete", SENDING)))
        .order_by(destination_attempts.c.started_at.desc(), destination_attempts.c.id.desc())
        .limit(limit)).all()
    return [DestinationFailure(event_id=r.event_id, attempt=r.number, at=r.started_at,
                               outcome=r.outcome, http_status=r.http_status, error=r.error,
                               latency_ms=r.latency_ms, response_excerpt=r.response_excerpt)
            for r in rows]


def read_destinations(conn: Connection, now: datetime, *,
                      integration_id: int | None = None) -> list[dict[str, Any]]:
    """Return every destination (or one integration's) with its health, oldest first."""
    scopes = dict(conn.execute(select(integrations.c.id, integrations.c.account + "/" +
                                      integrations.c.name)).all())
    since = now - timedelta(seconds=WINDOW_SECONDS)
    items = []
    for d in list_destinations(conn, integration_id=integration_id):
        held = d.blocked_until is not None and d.blocked_until > now
        items.append({
            **d.to_json(), "scope": scopes.get(d.integration_id),
            "state_reason": d.state_reason, "state_changed_at": d.state_changed_at,
            "timeout_seconds": d.timeout_seconds, "max_in_flight": d.max_in_flight,
            "rate_per_second": d.rate_per_second,
            "consecutive_failures": d.consecutive_failures,
            "blocked_until": d.blocked_until if held else None,
            **_stats(conn, d.id, since), "window_seconds": WINDOW_SECONDS,
            "backlog": _backlog(conn, d), "backlog_cap": BACKLOG_CAP,
            "recent_failures": recent_failures(conn, d.id)})
    return items


def hide_responses(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blank the destinations' response excerpts (for roles that may not see payloads)."""
    return [dict(item, recent_failures=[dict(f, response_excerpt=None)
                                        for f in item["recent_failures"]])
            for item in items]


def receipt_answers(conn: Connection, scope_id: int, event_id: str) -> list[DestinationAnswer]:
    """Return what destinations answered to each attempt of one receipt, oldest first."""
    rows = conn.execute(
        select(destination_attempts)
        .where(destination_attempts.c.scope_id == scope_id,
               destination_attempts.c.event_id == event_id)
        .order_by(destination_attempts.c.number, destination_attempts.c.id)).all()
    return [DestinationAnswer(attempt=r.number, at=r.started_at, outcome=r.outcome,
                              http_status=r.http_status, latency_ms=r.latency_ms,
                              error=r.error, response_excerpt=r.response_excerpt)
            for r in rows]
