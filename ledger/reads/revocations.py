"""Revocation evidence for the Credentials page: did every web instance pick it up, and
what did the intake do with the key afterwards.

Per revoked key: "refreshed on N of M web instances, slowest at most X s" from the
rows jobs/credential_jobs.py records (the first refresh it saw after the revocation,
so X is an upper bound), and the key's deliveries since `revoked_at` from the delivery
log's (key_id, at) index: accepted ones (inside the declared bound, while the
revocation propagated) each linked to its receipt, refused ones counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, select

from ledger.db.schema import deliveries, revocation_refreshes
from ledger.reads.models import RevocationEvidence, RevokedKeyUse
from ledger.scheduling.instances import InstanceKind, live_instances

ACCEPTED = ("accepted", "duplicate", "conflict")
LIST_LIMIT = 50
READ_LIMIT = 10_000


def revocation_evidence(conn: Connection, creds: Sequence[Mapping[str, Any]], *, now: datetime,
                        live_within: float) -> dict[str, RevocationEvidence]:
    """Return {key_id: evidence} for every revoked credential of `creds`."""
    revoked = [c for c in creds if c.get("revoked_at") is not None]
    if not revoked:
        return {}
    live = {i.id for i in live_instances(conn, now=now, within_seconds=live_within,
                                         kind=InstanceKind.WEB)}
    return {c["key_id"]: _evidence(conn, c["key_id"], c["revoked_at"], live) for c in revoked}


def _evidence(conn: Connection, key_id: str, revoked_at: datetime,
              live: set[str]) -> RevocationEvidence:
    """Return one revoked key's refreshes and its uses since the revocation."""
    refreshed, instances, missing, slowest = _refreshes(conn, key_id, revoked_at, live)
    accepted, accepted_count, refused, capped = _uses_after(conn, key_id, revoked_at)
    return RevocationEvidence(refreshed=refreshed, instances=instances, missing=missing,
                              slowest_seconds=slowest, accepted=accepted,
                              accepted_count=accepted_count, refused_count=refused,
                              uses_capped=capped)


def _refreshes(conn: Connection, key_id: str, revoked_at: datetime,
               live: set[str]) -> tuple[int, int, list[str], float | None]:
    """Return how many web instances refreshed after the revocation, of how many, slowest."""
    rows = conn.execute(select(revocation_refreshes.c.instance_id,
                               revocation_refreshes.c.refreshed_at)
                        .where(revocation_refreshes.c.key_id == key_id)).all()
    seen = {r.instance_id for r in rows}
    slowest = max(((r.refreshed_at - revoked_at).total_seconds() for r in rows), default=None)
    return len(seen), len(seen | live), sorted(live - seen), slowest


def uses_after_stmt(key_id: str, revoked_at: datetime) -> Select[Any]:
    """The key's deliveries since its revocation, oldest first: ix_deliveries_key's range."""
    return (select(deliveries.c.at, deliveries.c.outcome, deliveries.c.public_id,
                   deliveries.c.event_id, deliveries.c.client, deliveries.c.count)
            .where(deliveries.c.key_id == key_id, deliveries.c.at >= revoked_at)
            .order_by(deliveries.c.at).limit(READ_LIMIT + 1))


def _uses_after(conn: Connection, key_id: str, revoked_at: datetime,
                ) -> tuple[list[RevokedKeyUse], int, int, bool]:
    """Return the key's deliveries since revocation: accepted ones listed, refused counted."""
    rows = conn.execute(uses_after_stmt(key_id, revoked_at)).all()
    capped = len(rows) > READ_LIMIT
    rows = rows[:READ_LIMIT]
    accepted = [RevokedKeyUse(at=r.at, outcome=r.outcome, public_id=r.public_id,
                              event_id=r.event_id, client=r.client, count=r._mapping["count"],
                              after_seconds=(r.at - revoked_at).total_seconds())
                for r in rows if r.outcome in ACCEPTED]
    refused = sum(int(r._mapping["count"]) for r in rows if r.outcome not in ACCEPTED)
    return accepted[:LIST_LIMIT], len(accepted), refused, capped
