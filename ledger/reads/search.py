"""The header search: one box for an event id (every scope), an account, an integration.

Every lookup goes through an index: integrations by public id, by (account, name)
and by account (the leading column of that unique index); receipts by their primary
key (scope_id, event_id) with `scope_id IN (every scope)`. Integrations are few, so
matching a bare integration name reads them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, select

from ledger.db.schema import integrations, receipts
from ledger.domain import ReceiptState
from ledger.ids import EVENT_ID, INTEGRATION_ID, SLUG

QUERY_LIMIT = 255
HIT_LIMIT = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """One thing the query names: a receipt, an account or an integration."""

    kind: str  # "receipt", "account" or "integration"
    scope: str  # account/name, or the account alone
    public_id: str | None = None  # the integration's in_… id
    event_id: str | None = None
    state: str | None = None  # a receipt's state


def account_scope_ids(conn: Connection, account: str) -> tuple[int, ...]:
    """Return the scope ids of every integration of an account (empty when none)."""
    return tuple(conn.execute(select(integrations.c.id).where(integrations.c.account == account)
                              .order_by(integrations.c.id)).scalars())


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


def _receipt_hits(conn: Connection, q: str) -> list[Hit]:
    """Return the receipts with this event id, in every scope."""
    if not EVENT_ID.fullmatch(q):
        return []
    scopes = {r.id: r for r in conn.execute(
        select(integrations.c.id, integrations.c.account, integrations.c.name,
               integrations.c.public_id))}
    if not scopes:
        return []
    rows = conn.execute(select(receipts.c.scope_id, receipts.c.state)
                        .where(receipts.c.scope_id.in_(sorted(scopes)),
                               receipts.c.event_id == q).limit(HIT_LIMIT))
    return [Hit(kind="receipt", scope=f"{scopes[r.scope_id].account}/{scopes[r.scope_id].name}",
                public_id=scopes[r.scope_id].public_id, event_id=q,
                state=ReceiptState.from_code(r.state).value) for r in rows]


def search(conn: Connection, raw: str) -> list[Hit]:
    """Return everything the query names: receipts first, then the account, integrations."""
    q = (raw or "").strip()[:QUERY_LIMIT]
    if not q or not q.isprintable():
        return []
    hits = _receipt_hits(conn, q)
    if SLUG.fullmatch(q) and account_scope_ids(conn, q):
        hits.append(Hit(kind="account", scope=q))
    return hits + _integration_hits(conn, q)
