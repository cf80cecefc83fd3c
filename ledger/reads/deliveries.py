"""The delivery log's reads: filtered keyset pages, an event's deliveries, per-key usage.

Lists are newest first on (at, id): the (integration_id, at, id) index when an
integration is named, the partial (key_id, at) index for a key, the partial
(outcome, at, id) index for any outcome but `accepted`, else (at, id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, func, literal_column, select, tuple_

from ledger.db.schema import deliveries, integrations
from ledger.reads.cursor import Page, decode_cursor, encode_cursor
from ledger.reads.models import DeliveryItem, KeyUsage
from ledger.reads.receipts import MAX_LIMIT, scope_names

# The intake's outcomes (CONTRACT section 2 and 7): what the outcome filter accepts.
OUTCOMES = ("accepted", "duplicate", "conflict", "unauthenticated", "invalid_event",
            "body_too_large", "unknown_integration", "unavailable", "internal")
EVENT_TIMELINE_LIMIT = 200
USAGE_WINDOW = timedelta(hours=24)
USAGE_CAP_ROWS = 100_000

ITEM_COLUMNS = (deliveries.c.id, deliveries.c.at, deliveries.c.integration_id,
                deliveries.c.public_id, deliveries.c.outcome, deliveries.c.http_status,
                deliveries.c.key_id, deliveries.c.event_id, deliveries.c.client,
                deliveries.c.reason, deliveries.c.count)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryFilter:
    """What an operator asked to see in the delivery log; every field optional."""

    integration_id: int | None = None
    # Several integrations (an account, or a scope prefix); ignored with integration_id.
    integration_ids: tuple[int, ...] | None = None
    key_id: str | None = None
    event_id: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def _terms(f: DeliveryFilter) -> list[Any]:
    """Return the WHERE terms of a filter."""
    terms: list[Any] = []
    if f.integration_id is not None:
        terms.append(deliveries.c.integration_id == f.integration_id)
    elif f.integration_ids is not None:
        terms.append(deliveries.c.integration_id.in_(f.integration_ids))
    elif f.event_id is not None:
        # ix_deliveries_event leads with the integration: probe it once per integration.
        terms.append(deliveries.c.integration_id.in_(select(integrations.c.id)))
    if f.event_id is not None:
        terms.append(deliveries.c.event_id == f.event_id)
    if f.key_id is not None:
        terms.append(deliveries.c.key_id == f.key_id)
    if f.outcome is not None:
        terms.append(deliveries.c.outcome == f.outcome)
        if (f.outcome != "accepted" and f.integration_id is None and f.key_id is None
                and f.event_id is None and f.integration_ids is None):
            # Spelled out so the partial ix_deliveries_outcome matches whatever plan
            # PostgreSQL caches for the bound outcome. Not with an integration or a key:
            # their own index walks one sender's rows (combining both indexes and then
            # sorting takes 0.5 s at 10M rows).
            terms.append(deliveries.c.outcome != literal_column("'accepted'"))
    if f.since is not None:
        terms.append(deliveries.c.at >= f.since)
    if f.until is not None:
        terms.append(deliveries.c.at < f.until)
    return terms


def list_deliveries(conn: Connection, f: DeliveryFilter, *, cursor: str | None = None,
                    limit: int = 50) -> Page[DeliveryItem]:
    """Return one page of the delivery log, newest first."""
    limit = max(1, min(limit, MAX_LIMIT))
    key = None if cursor is None else decode_cursor(cursor, (datetime, int))
    rows = conn.execute(deliveries_stmt(f, key, limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    items = delivery_items(conn, rows)
    return Page(items=items, next_cursor=encode_cursor(rows[-1].at, rows[-1].id)
                if more else None)


def deliveries_stmt(f: DeliveryFilter, key: tuple[datetime, int] | None,
                    limit: int) -> Select[Any]:
    """Deliveries matching `f` after the keyset `key`, newest first."""
    terms = _terms(f)
    if key is not None:
        at, ident = key
        # The plain bound lets the index range-scan; the row comparison breaks ties.
        terms += [deliveries.c.at <= at,
                  tuple_(deliveries.c.at, deliveries.c.id) < tuple_(at, ident)]
    return (select(*ITEM_COLUMNS).where(*terms)
            .order_by(deliveries.c.at.desc(), deliveries.c.id.desc()).limit(limit))


def event_deliveries(conn: Connection, scope_id: int, event_id: str) -> list[DeliveryItem]:
    """Return every logged delivery of one event, oldest first (a receipt's timeline)."""
    return delivery_items(conn, conn.execute(event_deliveries_stmt(scope_id, event_id)).all())


def event_deliveries_stmt(scope_id: int, event_id: str) -> Select[Any]:
    """One event's deliveries, oldest first: the partial (integration_id, event_id) index."""
    return (select(*ITEM_COLUMNS)
            .where(deliveries.c.integration_id == scope_id, deliveries.c.event_id == event_id)
            .order_by(deliveries.c.at, deliveries.c.id).limit(EVENT_TIMELINE_LIMIT))


def delivery_items(conn: Connection, rows: Sequence[Any]) -> list[DeliveryItem]:
    """Turn deliveries rows into the read models the API and the pages show."""
    names = scope_names(conn, {r.integration_id for r in rows if r.integration_id is not None})
    items = []
    for r in rows:
        scope, public_id = names.get(r.integration_id, (None, r.public_id))
        items.append(DeliveryItem(
            at=r.at, integration=public_id or r.public_id, scope=scope, outcome=r.outcome,
            http_status=r.http_status, key_id=r.key_id, event_id=r.event_id, client=r.client,
            reason=r.reason, count=r.count))
    return items


# Refusal reasons of unauthenticated deliveries are fixed codes (AuthenticationFailed):
# their category is safe for every role; other reasons may quote the body.
_CATEGORY = re.compile(r"[a-z_]{1,40}")


def refusal_category(outcome: str, reason: str | None) -> str | None:
    """Return why a delivery was refused, in a word every role may see (None if accepted)."""
    if outcome in ("accepted", "duplicate"):
        return None
    if outcome == "unauthenticated" and reason and _CATEGORY.fullmatch(reason):
        return reason
    return outcome


def credential_usage(conn: Connection, creds: Sequence[Mapping[Any, Any]],
                     now: datetime) -> dict[str, KeyUsage]:
    """Return {key_id: last_used_at, uses_24h, uses_after_dead, uses_capped} from the log.

    "After dead" counts the key's matching signatures at or after its revocation or
    expiry: refused ones, and any accepted while the revocation propagated. Each count
    reads at most USAGE_CAP_ROWS rows of the (key_id, at) index; `uses_capped` says a
    count stopped there (a busy live key has a row per delivery).
    """
    usage = {}
    for cred in creds:
        key_id = cred["key_id"]
        last = conn.execute(select(func.max(deliveries.c.at))
                            .where(deliveries.c.key_id == key_id)).scalar()
        item = KeyUsage(last_used_at=last, uses_24h=0, uses_after_dead=0, uses_capped=False)
        deaths = [t for t in (cred.get("revoked_at"), cred.get("expires_at")) if t is not None]
        if last is not None:
            item["uses_24h"], capped = _uses_since(conn, key_id, now - USAGE_WINDOW)
            if deaths:
                item["uses_after_dead"], dead_capped = _uses_since(conn, key_id, min(deaths))
                capped = capped or dead_capped
            item["uses_capped"] = capped
        usage[key_id] = item
    return usage


def _uses_since(conn: Connection, key_id: str, since: datetime) -> tuple[int, bool]:
    """Return (deliveries signed by the key since `since`, whether the count was capped)."""
    rows = (select(deliveries.c.count).where(deliveries.c.key_id == key_id,
                                             deliveries.c.at >= since)
            .limit(USAGE_CAP_ROWS + 1).subquery())
    total, read = conn.execute(select(func.coalesce(func.sum(rows.c.count), 0),
                                      func.count())).one()
    return int(total), int(read) > USAGE_CAP_ROWS
