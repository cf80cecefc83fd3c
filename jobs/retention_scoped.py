"""The retention purge on a distributed (Citus) ledger: one scope at a time.

On plain PostgreSQL the purge walks PostgreSQL tables in heap-page windows (ctid ranges,
sized by pg_relation_size). On Citus neither works: the coordinator's table is
an empty shell (0 pages), ctid means nothing across shards, and a locking
statement must name one scope. So the purge there first reads which scopes
have expired rows (a read on every shard, no lock), then deletes each scope's
batches with statements that name that scope alone: each batch runs on the one
node holding the scope and commits there. retention.purge checks afterwards that
nothing it had to delete is left, and raises when something is.

Same rules as the page-window purge: a pending receipt is never touched; a
batch's receipts go with their attempts, failed work item, unsigned-body record and
conflicts in one transaction, the receipts locked first (a requeue waits).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial

from sqlalchemy import Connection, Engine, bindparam, text

from ledger.config import Settings
from ledger.db.schema import UTCDateTime
from ledger.metrics import PURGED_ROWS
from ledger.worker.failure_groups import forget_members

from .retention_batching import Pacer, run_batch

# Scopes with finished receipts accepted before the cutoff. The btree on
# accepted_at gives each shard the expired rows to read.
_EXPIRED_SCOPES = text("""
SELECT DISTINCT scope_id FROM receipts
WHERE accepted_at < :cutoff AND state IN (1, 2)
ORDER BY scope_id
""").bindparams(bindparam("cutoff", type_=UTCDateTime))

# One batch of one scope, in one statement that Citus routes to the scope's node
# (every part names `scope_id = :scope`; Citus would pull an INSERT ... SELECT to the
# coordinator, but these are DELETEs joined to one locked CTE).
_SCOPE_BATCH = text("""
WITH held AS MATERIALIZED (
    SELECT r.event_id, r.state, r.body_sha256 FROM receipts r
    WHERE r.scope_id = :scope AND r.accepted_at < :cutoff AND r.state IN (1, 2)
    LIMIT :batch
    FOR UPDATE OF r
), gone_receipts AS (
    DELETE FROM receipts r USING held h
    WHERE r.scope_id = :scope AND r.event_id = h.event_id RETURNING 1
), gone_attempts AS (
    DELETE FROM attempts a USING held h
    WHERE a.scope_id = :scope AND a.event_id = h.event_id RETURNING 1
), gone_jobs AS (
    DELETE FROM jobs j USING held h
    WHERE j.scope_id = :scope AND h.state = 2 AND j.event_id = h.event_id RETURNING 1
), gone_bodies AS (
    DELETE FROM unsigned_bodies u USING held h
    WHERE u.scope_id = :scope AND u.body_sha256 = h.body_sha256
      AND u.event_id = h.event_id RETURNING 1
), gone_conflicts AS (
    DELETE FROM conflicts c USING held h
    WHERE c.scope_id = :scope AND c.event_id = h.event_id RETURNING 1
), gone_members AS (
    DELETE FROM failure_members m USING held h
    WHERE m.scope_id = :scope AND h.state = 2 AND m.event_id = h.event_id
    RETURNING m.group_id
)
SELECT (SELECT count(*) FROM gone_receipts) AS receipts,
       (SELECT count(*) FROM gone_attempts) AS attempts,
       (SELECT count(*) FROM gone_jobs) AS jobs,
       (SELECT count(*) FROM gone_bodies) AS unsigned_bodies,
       (SELECT count(*) FROM gone_conflicts) AS conflicts,
       (SELECT json_agg(group_id) FROM gone_members) AS members
""").bindparams(bindparam("cutoff", type_=UTCDateTime))

_PAYLOAD_SCOPES = text("""
SELECT DISTINCT scope_id FROM jobs
WHERE status = 1 AND payload IS NOT NULL AND accepted_at < :review_cutoff
ORDER BY scope_id
""").bindparams(bindparam("review_cutoff", type_=UTCDateTime))

_SCOPE_PAYLOADS = text("""
UPDATE jobs SET payload = NULL, raw_body = NULL
WHERE scope_id = :scope AND event_id IN (
    SELECT event_id FROM jobs
    WHERE scope_id = :scope AND status = 1 AND payload IS NOT NULL
      AND accepted_at < :review_cutoff
    LIMIT :batch)
  AND status = 1 AND payload IS NOT NULL AND accepted_at < :review_cutoff
""").bindparams(bindparam("review_cutoff", type_=UTCDateTime))

# A replayed-body conflict names a fresh event id that never had a receipt: it
# expires with the original it pointed at (as in retention.expire_bookkeeping).
_ORPHAN_SCOPES = text("""
SELECT DISTINCT scope_id FROM conflicts WHERE last_seen < :cutoff ORDER BY scope_id
""").bindparams(bindparam("cutoff", type_=UTCDateTime))

_SCOPE_ORPHANS = text("""
DELETE FROM conflicts c
WHERE c.scope_id = :scope AND c.last_seen < :cutoff
  AND NOT EXISTS (SELECT 1 FROM receipts r
                  WHERE r.scope_id = :scope AND r.event_id = c.original_event_id)
""").bindparams(bindparam("cutoff", type_=UTCDateTime))

# What the purge had to delete and did not: finished before it started, accepted
# before the cutoff. A receipt that finished while it ran may stay for the next one.
_LEFT_BEHIND = text("""
SELECT count(*) FROM receipts
WHERE accepted_at < :cutoff AND state IN (1, 2)
  AND (completed_at IS NULL OR completed_at < :started)
""").bindparams(bindparam("cutoff", type_=UTCDateTime), bindparam("started", type_=UTCDateTime))


def expired_scopes(conn: Connection, cutoff: datetime) -> list[int]:
    """Return the scopes that hold finished receipts accepted before `cutoff`."""
    return [int(s) for s in conn.execute(_EXPIRED_SCOPES, {"cutoff": cutoff}).scalars()]


def scope_batch(conn: Connection, scope: int, cutoff: datetime, batch: int) -> dict[str, int]:
    """Delete up to `batch` expired receipts of one scope with their dependants."""
    held = dict(conn.execute(_SCOPE_BATCH, {"scope": scope, "cutoff": cutoff,
                                            "batch": batch}).one()._mapping)
    # A purged failure leaves its failure group (ledger.worker.failure_groups).
    forget_members(conn, [(gid, scope) for gid in held.pop("members") or ()])
    return {kind: int(n) for kind, n in held.items()}


def payload_scopes(conn: Connection, review_cutoff: datetime) -> list[int]:
    """Return the scopes with failed work items whose payload outlived the review window."""
    return [int(s) for s in conn.execute(_PAYLOAD_SCOPES,
                                         {"review_cutoff": review_cutoff}).scalars()]


def scope_payloads(conn: Connection, scope: int, review_cutoff: datetime, batch: int) -> int:
    """Drop up to `batch` reviewed payloads of one scope; return how many."""
    return conn.execute(_SCOPE_PAYLOADS, {"scope": scope, "review_cutoff": review_cutoff,
                                          "batch": batch}).rowcount


def orphan_scopes(conn: Connection, cutoff: datetime) -> list[int]:
    """Return the scopes with conflicts last seen before `cutoff`."""
    return [int(s) for s in conn.execute(_ORPHAN_SCOPES, {"cutoff": cutoff}).scalars()]


def scope_orphans(conn: Connection, scope: int, cutoff: datetime) -> int:
    """Delete one scope's conflicts past retention whose original receipt is gone."""
    return max(conn.execute(_SCOPE_ORPHANS, {"scope": scope, "cutoff": cutoff}).rowcount, 0)


def left_behind(conn: Connection, cutoff: datetime, started: datetime) -> int:
    """Count the expired receipts, finished before the purge began, that are still there."""
    return int(conn.execute(_LEFT_BEHIND, {"cutoff": cutoff, "started": started}).scalar_one())


def scoped_payloads(engine: Engine, settings: Settings, review_cutoff: datetime,
                    batch_size: int) -> int:
    """Distributed: drop reviewed failed payloads scope by scope, batch by batch."""
    with engine.connect() as conn:
        scopes = payload_scopes(conn, review_cutoff)
    total = 0
    for scope in scopes:
        while True:
            count = run_batch(engine, settings, partial(
                scope_payloads, scope=scope, review_cutoff=review_cutoff,
                batch=batch_size))
            total += count
            PURGED_ROWS.labels("payloads").inc(count)
            if count < batch_size:
                break
    return total


def scoped_receipts(engine: Engine, settings: Settings, cutoff: datetime, batch_size: int,
                    on_batch: Callable[[int], None] | None = None,
                    pacer: Pacer | None = None) -> int:
    """Distributed: delete expired receipts with their dependants, scope by scope."""
    with engine.connect() as conn:
        scopes = expired_scopes(conn, cutoff)
    total = 0
    for scope in scopes:
        while True:
            counts = run_batch(engine, settings, partial(
                scope_batch, scope=scope, cutoff=cutoff, batch=batch_size), pacer)
            for kind, count in counts.items():
                PURGED_ROWS.labels(kind).inc(count)
            total += counts["receipts"]
            if on_batch is not None:
                on_batch(total)
            if counts["receipts"] < batch_size:
                break
    return total
