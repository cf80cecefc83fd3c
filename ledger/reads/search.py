"""The header search: one box for an event id (every scope), an account, an integration.

Every lookup goes through an index: integrations by public id, by (account, name)
and by account (the leading column of that unique index); receipts by their primary
key (scope_id, event_id), probed once per scope. Integrations are few, so matching a
bare integration name reads them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, select, true

from ledger.db.schema import deliveries, integrations, receipts
from ledger.domain import ReceiptState
from ledger.ids import EVENT_ID, INTEGRATION_ID, SLUG

QUERY_LIMIT = 255
HIT_LIMIT = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """One thing the query names: a receipt, an account or an integration."""

    kind: str  # "receipt", "delivery" (the log's only trace of it), "account", "integration"
    scope: str  # account/name, or the account alone
    public_id: str | None = None  # the integration's in_… id
    event_id: str | None = None
    state: str | None = None  # a receipt's state, or a delivery's outcome


def account_scope_ids(conn: Connection, account: str) -> tuple[int, ...]:
    """Return the scope ids of every integration of an account (empty when none)."""
    return tuple(conn.execute(select(integrations.c.id).where(integrations.c.account == account)
                              .order_by(integrations.c.id)).scalars())


def scope_ids_with_prefix(conn: Connection, prefix: str, *, limit: int) -> tuple[int, ...]:
    """Return the scope ids whose `account/name` starts with `prefix` (at most `limit`)."""
    account, slash, name = prefix.partition("/")
    if slash:
        where = [integrations.c.account == account,
                 integrations.c.name.startswith(name, autoescape=True)]
    else:
        where = [integrations.c.account.startswith(account, autoescape=True)]
    return tuple(conn.execute(select(integrations.c.id).where(*where)
                              .order_by(integrations.c.id).limit(limit)).scalars())


def _integration_hits(conn: Connection, q: str) -> list[Hit]:
    """Return the integrations the query names: public id, account/name or bare name."""
    query = select(integrations.c.account, integrations.c.name, integrations.c.public_id)
    if INTEGRATION_ID.fullmatch(q):
        query = query.where(integrations.c.public_id == q)
    elif "/" in q:
        account, _, name = q.partition("/")
        query = query.where(integrations.c.account == account, integrations.c.name == name)
    elif SLUG.fullmatch(q):
        query = query.where(integrations.c.name == q)
    else:
        return []
    return [Hit(kind="integration", scope=f"{r.account}/{r.name}", public_id=r.public_id)
            for r in conn.execute(query.order_by(integrations.c.id).limit(HIT_LIMIT))]


def receipt_hits_stmt(q: str, *, lateral: bool) -> Select[Any]:
    """The receipts with event id `q` in every scope: one primary-key probe per scope.

    On PostgreSQL each probe is a LATERAL subquery (its LIMIT keeps the planner from
    flattening it into a join that scans receipts for the event id: the primary key
    leads with scope_id, and a parallel seq scan of a million receipts took ~1 s here
    with 10,000 scopes). SQLite loops over the integrations and probes the key.
    """
    scope = (integrations.c.id, integrations.c.account, integrations.c.name,
             integrations.c.public_id)
    if not lateral:
        return (select(*scope, receipts.c.state)
                .select_from(integrations.join(receipts, receipts.c.scope_id == integrations.c.id))
                .where(receipts.c.event_id == q).order_by(integrations.c.id).limit(HIT_LIMIT))
    hit = (select(receipts.c.state).where(receipts.c.scope_id == integrations.c.id,
                                          receipts.c.event_id == q)
           .limit(1).lateral("hit"))
    return (select(*scope, hit.c.state).select_from(integrations.join(hit, true()))
            .order_by(integrations.c.id).limit(HIT_LIMIT))


def _receipt_hits(conn: Connection, q: str) -> list[Hit]:
    """Return the receipts with this event id, in every scope."""
    if not EVENT_ID.fullmatch(q):
        return []
    rows = conn.execute(receipt_hits_stmt(q, lateral=conn.dialect.name == "postgresql"))
    return [Hit(kind="receipt", scope=f"{r.account}/{r.name}", public_id=r.public_id,
                event_id=q, state=ReceiptState.from_code(r.state).value) for r in rows]


def delivery_hits_stmt(q: str, *, lateral: bool) -> Select[Any]:
    """Each scope's newest delivery of event id `q`: one ix_deliveries_event probe per scope.

    The fallback for an event no receipt has: a refused delivery (a revoked key, a stale
    timestamp, a conflict) leaves only its row in the delivery log.
    """
    scope = (integrations.c.id, integrations.c.account, integrations.c.name,
             integrations.c.public_id)
    if not lateral:
        newest = (select(deliveries.c.outcome).where(
            deliveries.c.integration_id == integrations.c.id, deliveries.c.event_id == q)
            .order_by(deliveries.c.at.desc()).limit(1).scalar_subquery())
        hit = (select(*scope, newest.label("outcome")).subquery())
        return (select(hit).where(hit.c.outcome.is_not(None)).order_by(hit.c.id)
                .limit(HIT_LIMIT))
    found = (select(deliveries.c.outcome).where(deliveries.c.integration_id == integrations.c.id,
                                                deliveries.c.event_id == q)
             .order_by(deliveries.c.at.desc()).limit(1).lateral("hit"))
    return (select(*scope, found.c.outcome).select_from(integrations.join(found, true()))
            .order_by(integrations.c.id).limit(HIT_LIMIT))


def _delivery_hits(conn: Connection, q: str) -> list[Hit]:
    """Return the scopes whose delivery log has this event id (newest outcome each)."""
    rows = conn.execute(delivery_hits_stmt(q, lateral=conn.dialect.name == "postgresql"))
    return [Hit(kind="delivery", scope=f"{r.account}/{r.name}", public_id=r.public_id,
                event_id=q, state=r.outcome) for r in rows]


def search(conn: Connection, raw: str) -> list[Hit]:
    """Return everything the query names: receipts first (else logged deliveries), then the
    account, integrations."""
    q = (raw or "").strip()[:QUERY_LIMIT]
    if not q or not q.isprintable():
        return []
    hits = _receipt_hits(conn, q)
    if not hits and EVENT_ID.fullmatch(q):
        hits = _delivery_hits(conn, q)
    if SLUG.fullmatch(q) and account_scope_ids(conn, q):
        hits.append(Hit(kind="account", scope=q))
    return hits + _integration_hits(conn, q)
