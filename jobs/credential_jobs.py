"""Scheduled credential jobs: expire retiring keys, and check that revocations propagated.

Both are plain functions of (engine, [settings,] clock) that open their own
transaction; the scheduler decides when they run (once per period).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from ledger.access import audit
from ledger.access.credentials import SCHEDULER, expire_due_credentials
from ledger.clock import Clock
from ledger.config import Settings
from ledger.db.schema import credentials, findings, revocation_refreshes
from ledger.domain import CredentialState
from ledger.logs import get_logger
from ledger.scheduling.instances import (
    Instance,
    InstanceKind,
    live_instances,
    prune_instances,
)

log = get_logger("ledger.jobs.credentials")
REVOCATION_LAG = "revocation_lag"
INSTANCE_MEMORY = timedelta(days=1)  # a process silent this long crashed: forget it
# Revocations this recent get propagation evidence (a refresh row per live web instance).
EVIDENCE_WINDOW = timedelta(days=1)


def expire_credentials(engine: Engine, clock: Clock) -> int:
    """Mark every retiring credential past its expires_at as expired; return how many."""
    with engine.begin() as conn:
        count = expire_due_credentials(conn, now=clock.now(), actor=SCHEDULER)
    if count:
        log.info("credentials.expired", count=count)
    return count


def latest_revocation(conn: Connection) -> datetime | None:
    """Return when the newest revocation happened (None if no key was ever revoked)."""
    return conn.execute(
        select(func.max(credentials.c.revoked_at))
        .where(credentials.c.state == CredentialState.REVOKED.value)
    ).scalar()


def lagging(instance: Instance, revoked_at: datetime) -> bool:
    """Tell whether an instance's credential view predates the revocation."""
    refreshed = instance.credentials_refreshed_at
    return refreshed is None or refreshed < revoked_at


def check_revocation_propagation(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Flag every live web instance still on a view older than the newest revocation + bound.

    Dead instances (no beat within the bound) are not flagged: they serve nothing.
    Workers and schedulers are not either: they verify no signature, hold no view.
    """
    now = clock.now()
    bound = settings.revocation_bound_seconds
    with engine.begin() as conn:
        prune_instances(conn, silent_since=now - INSTANCE_MEMORY)
        # "Live" = beat within the bound; a beat is due every quarter of it.
        live = live_instances(conn, now=now, within_seconds=bound, kind=InstanceKind.WEB)
        record_refreshes(conn, live, now=now)
        revoked_at = latest_revocation(conn)
        flagged: list[Instance] = []
        if revoked_at is not None and now >= revoked_at + timedelta(seconds=bound):
            flagged = [i for i in live if lagging(i, revoked_at)]
            for instance in flagged:
                _open_finding(conn, instance, revoked_at, bound=bound, now=now)
        _resolve_others(conn, {i.id for i in flagged}, now=now)
    for instance in flagged:
        log.warning("credentials.revocation_lag", instance=instance.id, bound_seconds=bound)
    return len(flagged)


def record_refreshes(conn: Connection, live: list[Instance], *, now: datetime) -> int:
    """Note each live web instance's first refresh seen after each recent revocation."""
    recent = conn.execute(
        select(credentials.c.key_id, credentials.c.revoked_at)
        .where(credentials.c.state == CredentialState.REVOKED.value,
               credentials.c.revoked_at >= now - EVIDENCE_WINDOW)).all()
    rows = [{"key_id": r.key_id, "instance_id": i.id, "refreshed_at": i.credentials_refreshed_at,
             "seen_at": now}
            for r in recent for i in live
            if i.credentials_refreshed_at is not None
            and i.credentials_refreshed_at >= r.revoked_at]
    if not rows:
        return 0
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return int(conn.execute(dialect.insert(revocation_refreshes).values(rows)
                            .on_conflict_do_nothing()).rowcount)


def _open_finding(conn: Connection, instance: Instance, revoked_at: datetime, *,
                  bound: float, now: datetime) -> None:
    """Record (or refresh) the finding; audit it when it opens."""
    refreshed = instance.credentials_refreshed_at
    detail = json.dumps({
        "revoked_at": revoked_at.isoformat(), "bound_seconds": bound,
        "credentials_refreshed_at": refreshed.isoformat() if refreshed else None,
        "heartbeat_at": instance.heartbeat_at.isoformat(),
    }, sort_keys=True)
    existing = conn.execute(
        select(findings.c.id, findings.c.resolved_at)
        .where(findings.c.kind == REVOCATION_LAG, findings.c.subject == instance.id)
    ).first()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(findings).values(kind=REVOCATION_LAG, subject=instance.id,
                                           detail=detail, first_seen=now, last_seen=now)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["kind", "subject"],
        set_={"detail": detail, "last_seen": now, "resolved_at": None}))
    if existing is None or existing.resolved_at is not None:
        audit.record(conn, SCHEDULER, "instance.revocation_lag", instance.id, at=now,
                     detail=json.loads(detail))


def _resolve_others(conn: Connection, flagged: set[str], *, now: datetime) -> None:
    """Close the open lag findings of instances that caught up or went away."""
    query = (update(findings)
             .where(findings.c.kind == REVOCATION_LAG, findings.c.resolved_at.is_(None))
             .values(resolved_at=now))
    if flagged:
        query = query.where(findings.c.subject.not_in(flagged))
    conn.execute(query)
