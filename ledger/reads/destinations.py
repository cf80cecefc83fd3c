"""Destinations as the dashboard and /api/v1/destinations show them (never a secret).

Per destination: its settings and state, and from its recent answered attempts the
success rate, the p95 latency and the latest failures (a request still open, or whose
worker died before it recorded the answer, is `sending`: only a receipt's answers show
it); its backlog is its integration's queued work items of the types it takes, counted up to
BACKLOG_CAP.

The page reads every destination's figures in three statements, not three per
destination, each made of one bounded, indexed read per destination (the newest
attempts, the capped backlog) or one pass (the latest failures), so a hundred
destinations cost three round trips and the database, not the web process, sorts the
sample. On PostgreSQL the bounded reads are LATERAL joins from the destinations table:
one short statement whatever the number of destinations, compiled once and cached. SQLite
has no LATERAL; there each statement is a UNION ALL of the per-destination reads (at a
hundred destinations that statement took the web process about 40 ms to compile, and
the database about as long to plan, on each view).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Integer, case, func, literal, select, text, true, union_all

from ledger.db.schema import destination_attempts, destinations, integrations, jobs
from ledger.destinations.store import SENDING, Destination, list_destinations
from ledger.domain import JobStatus
from ledger.reads.models import DestinationAnswer, DestinationFailure

WINDOW_SECONDS = 24 * 3600
# The rate and p95 are computed over at most this many of the newest attempts in the
# window: enough for a stable p95, bounded however busy the destination is.
SAMPLE_LIMIT = 2000
BACKLOG_CAP = 10_000
FAILURES_SHOWN = 5
# Destinations per UNION ALL statement: SQLite allows 500 terms in a compound SELECT.
UNION_BATCH = 200


def _batches(items: list[Any]) -> list[list[Any]]:
    """Split `items` into UNION_BATCH-sized lists."""
    return [items[i:i + UNION_BATCH] for i in range(0, len(items), UNION_BATCH)]


def p95(values: list[float]) -> float | None:
    """Return the 95th percentile (nearest rank) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _tagged(destination_id: int, query: Any) -> Any:
    """One destination's bounded read as a subquery tagged with its id (for UNION ALL)."""
    sub = query.subquery()
    return select(literal(destination_id, Integer).label("destination_id"), *sub.c)


def _answered(destination_id: int, since: datetime) -> Any:
    """The destination's newest answered attempts since `since`, up to SAMPLE_LIMIT."""
    return (select(destination_attempts.c.outcome, destination_attempts.c.latency_ms)
            .where(destination_attempts.c.destination_id == destination_id,
                   destination_attempts.c.started_at >= since,
                   destination_attempts.c.outcome != SENDING)  # answered attempts only
            .order_by(destination_attempts.c.started_at.desc()).limit(SAMPLE_LIMIT))


def _lateral_sample(ids: list[int], since: datetime) -> Any:
    """PostgreSQL: the newest answered attempts of each destination of `ids`, up to
    SAMPLE_LIMIT each, as one LATERAL join (the same reads as `_answered`)."""
    a = destination_attempts
    newest = (select(a.c.outcome, a.c.latency_ms)
              .where(a.c.destination_id == destinations.c.id, a.c.started_at >= since,
                     a.c.outcome != SENDING)
              .order_by(a.c.started_at.desc()).limit(SAMPLE_LIMIT).lateral("newest"))
    return (select(destinations.c.id.label("destination_id"), newest.c.outcome,
                   newest.c.latency_ms)
            .select_from(destinations.join(newest, true()))
            .where(destinations.c.id.in_(ids)))


def _all_stats(conn: Connection, ids: list[int], since: datetime
               ) -> dict[int, dict[str, Any]]:
    """Each destination's attempts sampled, success rate and p95 latency since `since`."""
    out: dict[int, dict[str, Any]] = {
        i: {"attempts_sampled": 0, "success_rate": None, "p95_latency_ms": None} for i in ids}
    lateral = conn.dialect.name == "postgresql"
    for batch in [ids] if lateral else _batches(ids):
        reads: Any = (_lateral_sample(batch, since) if lateral
                      else union_all(*[_tagged(i, _answered(i, since)) for i in batch]))
        sample = reads.subquery()
        ranked = select(
            sample.c.destination_id, sample.c.outcome, sample.c.latency_ms,
            func.row_number().over(partition_by=sample.c.destination_id,
                                   order_by=sample.c.latency_ms).label("rank"),
            func.count().over(partition_by=sample.c.destination_id).label("n")).subquery()
        # p95 by nearest rank, as p95() computes it: the ceil(0.95 n)-th smallest latency.
        nearest = (ranked.c.n * 95 + 99) // 100
        rows = conn.execute(select(
            ranked.c.destination_id, func.count().label("n"),
            func.sum(case((ranked.c.outcome == "complete", 1), else_=0)).label("ok"),
            func.max(case((ranked.c.rank == nearest, ranked.c.latency_ms))).label("p95"))
            .group_by(ranked.c.destination_id)).all()
        for r in rows:
            out[r.destination_id] = {"attempts_sampled": int(r.n),
                                     "success_rate": round(int(r.ok) / int(r.n), 4),
                                     "p95_latency_ms": r.p95}
    return out


# PostgreSQL: each destination's backlog as one LATERAL count of its integration's queued
# work items of its types (`event_types` is a JSON array, NULL for every type), capped.
_BACKLOGS_PG = text("""
SELECT d.id, b.n
FROM destinations d
CROSS JOIN LATERAL (
  SELECT count(*) AS n FROM (
    SELECT 1 FROM jobs j
    WHERE j.scope_id = d.integration_id AND j.status = :queued
      AND (d.event_types IS NULL
           OR j.event_type IN (SELECT jsonb_array_elements_text(d.event_types::jsonb)))
    LIMIT :cap) capped) b
WHERE d.id = ANY(:ids)
""")


def _all_backlogs(conn: Connection, found: list[Destination]) -> dict[int, int]:
    """Each destination's queued events (its integration's jobs of its types, capped)."""
    if conn.dialect.name == "postgresql":
        rows = conn.execute(_BACKLOGS_PG, {"queued": JobStatus.QUEUED.value,
                                           "cap": BACKLOG_CAP, "ids": [d.id for d in found]})
        return {d.id: 0 for d in found} | {int(i): int(n) for i, n in rows}
    out: dict[int, int] = {}
    for batch in _batches(found):
        out |= _backlogs(conn, batch)
    return out


def _backlogs(conn: Connection, found: list[Destination]) -> dict[int, int]:
    """One statement's worth of `_all_backlogs`."""
    counts = []
    for d in found:
        terms = [jobs.c.scope_id == d.integration_id, jobs.c.status == JobStatus.QUEUED.value]
        if d.event_types is not None:
            terms.append(jobs.c.event_type.in_(d.event_types))
        capped = select(jobs.c.event_id).where(*terms).limit(BACKLOG_CAP).subquery()
        counts.append(select(literal(d.id, Integer).label("destination_id"),
                             func.count().label("n")).select_from(capped))
    return {int(i): int(n) for i, n in conn.execute(union_all(*counts)).all()}


def _failures_query(destination_id: int, limit: int) -> Any:
    """The destination's latest attempts that did not complete, newest first."""
    return (select(destination_attempts)
            .where(destination_attempts.c.destination_id == destination_id,
                   destination_attempts.c.outcome.not_in(("complete", SENDING)))
            .order_by(destination_attempts.c.started_at.desc(),
                      destination_attempts.c.id.desc())
            .limit(limit))


def _failure(r: Any) -> DestinationFailure:
    """One failed attempt as the page and the API show it."""
    return DestinationFailure(event_id=r.event_id, attempt=r.number, at=r.started_at,
                              outcome=r.outcome, http_status=r.http_status, error=r.error,
                              latency_ms=r.latency_ms, response_excerpt=r.response_excerpt)


def _all_failures(conn: Connection, ids: list[int]) -> dict[int, list[DestinationFailure]]:
    """Each destination's latest failed attempts, newest first: one pass over the failed
    attempts of them all (per destination, the newest scan would read every success)."""
    out: dict[int, list[DestinationFailure]] = {i: [] for i in ids}
    for batch in _batches(ids):
        a = destination_attempts
        ranked = select(a, func.row_number().over(
            partition_by=a.c.destination_id,
            order_by=(a.c.started_at.desc(), a.c.id.desc())).label("nth")).where(
            a.c.destination_id.in_(batch), a.c.outcome.not_in(("complete", SENDING))
        ).subquery()
        for r in conn.execute(select(ranked).where(ranked.c.nth <= FAILURES_SHOWN).order_by(
                ranked.c.destination_id, ranked.c.nth)).all():
            out[r.destination_id].append(_failure(r))
    return out


def recent_failures(conn: Connection, destination_id: int, *,
                    limit: int = FAILURES_SHOWN) -> list[DestinationFailure]:
    """Return the destination's latest attempts that did not complete, newest first."""
    return [_failure(r) for r in conn.execute(_failures_query(destination_id, limit)).all()]


def read_destinations(conn: Connection, now: datetime, *,
                      integration_id: int | None = None) -> list[dict[str, Any]]:
    """Return every destination (or one integration's) with its health, oldest first."""
    found = list_destinations(conn, integration_id=integration_id)
    ids = [d.id for d in found]
    scopes = dict(conn.execute(select(integrations.c.id, integrations.c.account + "/" +
                                      integrations.c.name).where(
        integrations.c.id.in_({d.integration_id for d in found}))).all()) if found else {}
    since = now - timedelta(seconds=WINDOW_SECONDS)
    stats, backlogs = _all_stats(conn, ids, since), _all_backlogs(conn, found)
    failures = _all_failures(conn, ids)
    items = []
    for d in found:
        held = d.blocked_until is not None and d.blocked_until > now
        items.append({
            **d.to_json(), "scope": scopes.get(d.integration_id),
            "state_reason": d.state_reason, "state_changed_at": d.state_changed_at,
            "timeout_seconds": d.timeout_seconds, "max_in_flight": d.max_in_flight,
            "rate_per_second": d.rate_per_second,
            "consecutive_failures": d.consecutive_failures,
            "blocked_until": d.blocked_until if held else None,
            **stats[d.id], "window_seconds": WINDOW_SECONDS,
            "backlog": backlogs[d.id], "backlog_cap": BACKLOG_CAP,
            "recent_failures": failures[d.id]})
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
