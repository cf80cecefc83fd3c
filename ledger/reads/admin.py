"""Conflicts, integrations with their credentials, and the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, func, or_, select, tuple_

from ledger.access.credentials import LIVE_STATES
from ledger.access.integrations import get_integration
from ledger.db.schema import audit_log, conflicts, credentials, integrations
from ledger.domain import Integration
from ledger.reads.cursor import Page, decode_cursor, encode_cursor
from ledger.reads.deliveries import credential_usage
from ledger.reads.models import AuditItem, CredentialItem, IntegrationLiveKeys, ListedConflict
from ledger.reads.receipts import MAX_LIMIT, conflict_columns, conflict_item, scope_names


def list_conflicts(conn: Connection, *, scope_id: int | None = None,
                   unacknowledged: bool = False, cursor: str | None = None,
                   limit: int = 50) -> Page[ListedConflict]:
    """Return one page of conflicts, most recently seen first."""
    limit = max(1, min(limit, MAX_LIMIT))
    terms = []
    if scope_id is not None:
        terms.append(conflicts.c.scope_id == scope_id)
    if unacknowledged:
        terms.append(conflicts.c.acknowledged_at.is_(None))
    if cursor is not None:
        seen, ident = decode_cursor(cursor, (datetime, int))
        terms += [conflicts.c.last_seen <= seen,
                  tuple_(conflicts.c.last_seen, conflicts.c.id) < tuple_(seen, ident)]
    rows = conn.execute(select(*conflict_columns()).where(*terms)
                        .order_by(conflicts.c.last_seen.desc(), conflicts.c.id.desc())
                        .limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    names = scope_names(conn, {r.scope_id for r in rows})
    items = []
    for r in rows:
        scope, public_id = names.get(r.scope_id, (str(r.scope_id), ""))
        items.append(ListedConflict(**conflict_item(r), scope=scope, integration=public_id))
    return Page(items=items, next_cursor=encode_cursor(rows[-1].last_seen, rows[-1].id)
                if more else None)


def list_integrations(conn: Connection, *, account: str | None = None,
                      cursor: str | None = None, limit: int = 50) -> Page:
    """Return one page of integrations by scope (the unique (account, name) index)."""
    limit = max(1, min(limit, MAX_LIMIT))
    terms = []
    if account:
        terms.append(integrations.c.account == account)
    if cursor is not None:
        terms.append(tuple_(integrations.c.account, integrations.c.name)
                     > tuple_(*decode_cursor(cursor, (str, str))))
    rows = conn.execute(select(integrations).where(*terms)
                        .order_by(integrations.c.account, integrations.c.name)
                        .limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    items = [dict(r._mapping, scope=f"{r.account}/{r.name}") for r in rows]
    return Page(items=items, next_cursor=encode_cursor(rows[-1].account, rows[-1].name)
                if more else None)


def integrations_with_live_keys(conn: Connection, *, now: datetime,
                                account: str | None = None) -> list[IntegrationLiveKeys]:
    """Return every integration (or one account's) by scope, with its keys that verify now.

    `live_keys` counts active credentials and retiring ones before their `expires_at`:
    0 means every delivery to the integration is refused with 401.
    """
    live = (select(credentials.c.integration_id, func.count().label("live"))
            .where(credentials.c.state.in_(LIVE_STATES),
                   or_(credentials.c.expires_at.is_(None), credentials.c.expires_at > now))
            .group_by(credentials.c.integration_id).subquery())
    query = (select(integrations.c.public_id, integrations.c.account, integrations.c.name,
                    integrations.c.profile, integrations.c.created_at,
                    func.coalesce(live.c.live, 0).label("live_keys"))
             .select_from(integrations.outerjoin(live, live.c.integration_id
                                                 == integrations.c.id))
             .order_by(integrations.c.account, integrations.c.name))
    if account is not None:
        query = query.where(integrations.c.account == account)
    return [IntegrationLiveKeys(integration=r.public_id, scope=f"{r.account}/{r.name}",
                                profile=r.profile, created_at=r.created_at.isoformat(),
                                live_keys=int(r.live_keys))
            for r in conn.execute(query)]


def read_credentials(conn: Connection, public_id: str, now: datetime | None = None,
                     ) -> tuple[Integration, list[CredentialItem]]:
    """Return an integration and its credentials (never a secret); NotFound when unknown."""
    integration = get_integration(conn, public_id)
    return integration, credential_rows(conn, integration.id, now)


def credential_rows(conn: Connection, integration_id: int,
                    now: datetime | None = None) -> list[CredentialItem]:
    """Return an integration's credentials, newest first, never the secret, with their use.

    Use comes from the delivery log: `last_used_at`, `uses_24h`, `uses_after_dead`.
    """
    rows = conn.execute(
        select(credentials.c.key_id, credentials.c.state, credentials.c.fingerprint,
               credentials.c.created_at, credentials.c.expires_at, credentials.c.revoked_at,
               credentials.c.revoked_reason, credentials.c.label)
        .where(credentials.c.integration_id == integration_id)
        .order_by(credentials.c.id.desc()))
    items = [r._mapping for r in rows]
    usage = credential_usage(conn, items, now or datetime.now(UTC))
    return [CredentialItem(
        key_id=c["key_id"], state=c["state"], fingerprint=c["fingerprint"],
        created_at=c["created_at"], expires_at=c["expires_at"], revoked_at=c["revoked_at"],
        revoked_reason=c["revoked_reason"], label=c["label"], **usage[c["key_id"]])
        for c in items]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditFilter:
    """Audit log filters; every field optional."""

    actor: str | None = None
    action: str | None = None
    scope: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def list_audit(conn: Connection, f: AuditFilter, *, cursor: str | None = None,
               limit: int = 50) -> Page[AuditItem]:
    """Return one page of audit rows, newest first (keyset on id)."""
    limit = max(1, min(limit, MAX_LIMIT))
    terms = []
    if f.actor:
        terms.append(audit_log.c.actor == f.actor)
    if f.action:
        terms.append(audit_log.c.action == f.action)
    if f.scope:
        terms.append(audit_log.c.scope == f.scope)
    if f.since is not None:
        terms.append(audit_log.c.at >= f.since)
    if f.until is not None:
        terms.append(audit_log.c.at < f.until)
    if cursor is not None:
        terms.append(audit_log.c.id < decode_cursor(cursor, (int,))[0])
    rows = conn.execute(
        select(audit_log.c.id, audit_log.c.at, audit_log.c.actor, audit_log.c.role,
               audit_log.c.action, audit_log.c.target, audit_log.c.scope, audit_log.c.reason,
               audit_log.c.detail, audit_log.c.request_id)
        .where(*terms).order_by(audit_log.c.id.desc()).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(items=[AuditItem(id=r.id, at=r.at, actor=r.actor, role=r.role, action=r.action,
                                 target=r.target, scope=r.scope, reason=r.reason,
                                 detail=r.detail, request_id=r.request_id) for r in rows],
                next_cursor=encode_cursor(rows[-1].id) if more else None)
