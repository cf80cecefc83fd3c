"""PostgreSQL's hot worker statements: one claim, one hold, one completion for N work items.

A worker claims up to N work items in one statement (`CLAIM_SQL`; for N = 1,
`CLAIM_ONE_SQL`, the same template without its grouping steps), locks the ones still leased to it
(`HOLD_SQL`) when it must, and completes them in one statement at the end of
their transaction (`COMPLETE_SQL`, or `COMPLETE_AND_CLAIM_SQL` inside a worker's
loop, which claims the next ones too). `ledger.worker.store` uses them and runs
SQLite's plain statements instead (and a distributed ledger's, keyed by scope).
Bind names differ from column names, as in the store. Each statement keys its
rows by scope, except the claim's pick of the oldest due items (README,
"Scaling past one database").
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Integer,
    Text,
    TextualSelect,
    bindparam,
    column,
    text,
)

from ledger.db.driver import DriverStatement
from ledger.db.schema import UTCDateTime

_TIMES = ("now", "leased_until", "oldest_window")

_CLAIM_COLUMNS = """
       due.scope_id, due.event_id, due.event_type, due.accepted_at, due.attempts,
       due.lease_token, due.payload, counted.attempts AS number,
       counted.accepted_at AS receipt_accepted_at"""
# Positional columns: SQLAlchemy caches the result layout (by name it rebuilds it per call).
_CLAIM_RESULT = (
    column("scope_id", Integer), column("event_id", Text), column("event_type", Text),
    column("accepted_at", UTCDateTime), column("attempts", Integer),
    column("lease_token", BigInteger), column("payload", Text), column("number", Integer),
    column("receipt_accepted_at", UTCDateTime))

# The claim: up to :batch work items at once, each with
# its own fencing token, lease, counted attempt and attempt row, all with the same
# lease end. A work item that may not start (out of attempts or too old: the worker
# ends it with fail_unstarted) or whose receipt is gone is returned uncounted.
# A batch is one scope's jobs where it can be: `oldest` locks the oldest due job,
# `mates` the oldest due jobs of its scope (ix_jobs_scope_due; `oldest`'s row is
# among them, a row this statement locked is not skipped), and `others` fills the
# batch with the oldest due jobs of other scopes only when that scope has fewer.
# A batch holds the rows its handlers write (per-scope rows such as an account's
# balance) until it commits, so batches of many scopes would make workers wait on
# each other's rows (the demo's balance rows, say).
# `ranked` numbers the picked jobs (window functions cannot share a level with
# FOR UPDATE); `due` keeps the first one always and the others only if neither it
# nor they must run alone:
# a job whose last lease expired unfinished (leased_by is still set: its worker
# vanished, and it may be what killed it) or whose handler has a prepare step
# (:alone_types: slow work outside any transaction) is claimed by itself, so a
# job that kills its worker costs its batch-mates an attempt once, not every
# time. Picked jobs left out are unlocked when the statement (autocommit) or
# the completion's transaction ends, still due.
_PICKED = """
    SELECT scope_id, event_id, event_type, accepted_at, attempts, lease_token, payload,
           run_at, leased_by IS NOT NULL
                   OR event_type = ANY(CAST(:alone_types AS text[])) AS alone"""
_DUE_COLUMNS = "scope_id, event_id, event_type, accepted_at, attempts, lease_token, payload"
# The oldest due job no other worker holds ({columns} of it; {due} adds the conditions
# of COMPLETE_AND_CLAIM_SQL).
_OLDEST = """
    SELECT {columns} FROM jobs
    WHERE status = 0 AND run_at <= :now{due}
    ORDER BY run_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED"""
_PICK_MANY = """
oldest AS MATERIALIZED (""" + _OLDEST.replace("{columns}", "scope_id") + """
), mates AS MATERIALIZED (""" + _PICKED + """
    FROM jobs
    WHERE status = 0 AND run_at <= :now AND scope_id = (SELECT scope_id FROM oldest){due}
    ORDER BY run_at
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), others AS MATERIALIZED (""" + _PICKED + """
    FROM jobs
    WHERE status = 0 AND run_at <= :now AND scope_id <> (SELECT scope_id FROM oldest){due}
    ORDER BY run_at
    LIMIT :batch - (SELECT count(*) FROM mates)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT * FROM mates UNION ALL SELECT * FROM others
), ranked AS MATERIALIZED (
    SELECT *, row_number() OVER (ORDER BY run_at, scope_id, event_id) AS place FROM picked
), due AS MATERIALIZED (
    SELECT """ + _DUE_COLUMNS + """
    FROM ranked
    WHERE place = 1 OR NOT (alone OR (SELECT first.alone FROM ranked first
                                      WHERE first.place = 1))
)"""
# A claim of one item (:batch = 1) needs none of the grouping: `due` is `oldest`
# with its columns, alone or not (one item always runs alone).
_PICK_ONE = """
due AS MATERIALIZED (""" + _OLDEST.replace("{columns}", _DUE_COLUMNS) + """
)"""
_CLAIM_TAIL = """, counted AS (
    UPDATE receipts r SET attempts = r.attempts + 1
    FROM due
    WHERE r.scope_id = due.scope_id AND r.event_id = due.event_id
      AND due.attempts < :max_attempts AND due.accepted_at >= :oldest_window
    RETURNING r.scope_id, r.event_id, r.attempts, r.accepted_at
), leased AS (
    UPDATE jobs j SET attempts = j.attempts + 1, lease_token = j.lease_token + 1,
                      leased_by = :worker_id, leased_until = :leased_until,
                      run_at = :leased_until
    FROM counted
    WHERE j.scope_id = counted.scope_id AND j.event_id = counted.event_id
    RETURNING j.lease_token
), opened AS (
    INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token, started_at)
    SELECT counted.scope_id, counted.event_id, counted.attempts, :worker_id,
           due.lease_token + 1, :now
    FROM due JOIN counted
      ON counted.scope_id = due.scope_id AND counted.event_id = due.event_id
    RETURNING 1
)"""


def _claim_ctes(*, one: bool, due: str = "") -> str:
    """Return the claim's CTEs: the pick of up to :batch items (`one`: of one), then the
    shared tail that counts, leases and opens each item's attempt."""
    return (_PICK_ONE if one else _PICK_MANY).replace("{due}", due) + _CLAIM_TAIL


_CLAIM_FROM = """
FROM due LEFT JOIN counted
  ON counted.scope_id = due.scope_id AND counted.event_id = due.event_id"""


def _claim(*, one: bool) -> TextualSelect:
    return text(
        "WITH" + _claim_ctes(one=one) + "\nSELECT" + _CLAIM_COLUMNS + _CLAIM_FROM
    ).bindparams(*(bindparam(name, type_=UTCDateTime) for name in _TIMES)).columns(
        *_CLAIM_RESULT)


CLAIM_SQL = _claim(one=False)
CLAIM_ONE_SQL = _claim(one=True)  # the same claim with :batch = 1

# The first statement of a transaction over several work items (or over one whose
# handler does not run: a failure or a hand-back to record): lock every one whose
# token is still ours, in key order (every batch locks in the same order, so two
# batches never deadlock on job rows), waiting out a claim in flight as
# hold_lease does. Until the commit no other worker can claim these jobs, even
# once their leases have expired: a slow handler early in the batch cannot let
# its batch-mates be taken over under it. A job missing from the answer was
# taken over before the batch began: it is fenced and its handler never runs. A lone
# item whose handler runs is not held: its completion's fence (the DELETE below,
# last) tells whether the lease held, and a lost one rolls its transaction back.
HOLD_SQL = text("""
SELECT j.scope_id, j.event_id
FROM jobs j
JOIN unnest(CAST(:sids AS bigint[]), CAST(:eids AS text[]), CAST(:tokens AS bigint[]))
     AS mine(sid, eid, token)
  ON j.scope_id = mine.sid AND j.event_id = mine.eid AND j.lease_token = mine.token
WHERE j.status = 0
ORDER BY j.scope_id, j.event_id
FOR UPDATE OF j
""").columns(column("scope_id", Integer), column("event_id", Text))

# The completion of every work item whose handler succeeded, in one statement.
# `gone` is the fence: an item goes only while our token is still its token; its
# receipt and attempt join `gone`, so they change only if it held. `held` lets the
# caller check it: held items always pass, a lone unheld item that fails it is
# rolled back (its handler's writes too). A job row
# is locked before its receipt here as in every other writer: no deadlock on them.
# `mine` is the items: arrays (one element per item), or for one item its scalars.
_MINE_MANY = """
    SELECT * FROM unnest(CAST(:sids AS bigint[]), CAST(:eids AS text[]),
                         CAST(:tokens AS bigint[]), CAST(:numbers AS int[]),
                         CAST(:refs AS text[])) AS m(sid, eid, token, number, ref)"""
_MINE_ONE = """
    SELECT CAST(:sid AS bigint) AS sid, CAST(:eid AS text) AS eid,
           CAST(:token AS bigint) AS token, CAST(:number AS int) AS number,
           CAST(:ref AS text) AS ref"""
_COMPLETE_CTES = """
mine AS ({mine}
), gone AS (
    DELETE FROM jobs j USING mine
    WHERE j.scope_id = mine.sid AND j.event_id = mine.eid AND j.lease_token = mine.token
      AND j.status = 0
    RETURNING j.scope_id, j.event_id
), done AS (
    UPDATE receipts r SET state = :complete, completed_at = :now, result_ref = mine.ref
    FROM gone JOIN mine ON mine.sid = gone.scope_id AND mine.eid = gone.event_id
    WHERE r.scope_id = gone.scope_id AND r.event_id = gone.event_id
    RETURNING 1
), closed AS (
    UPDATE attempts a SET finished_at = :now, outcome = 'complete', error = NULL
    FROM gone JOIN mine ON mine.sid = gone.scope_id AND mine.eid = gone.event_id
    WHERE a.scope_id = gone.scope_id AND a.event_id = gone.event_id
      AND a.number = mine.number AND a.lease_token = mine.token
    RETURNING 1
)"""


# One item's completion names its key in every part, as a distributed ledger needs to
# route it to one shard: the same CTEs with each join on `mine` spelled as the item's key.
_KEYED_ONE = (
    ("WHERE j.scope_id = mine.sid AND j.event_id = mine.eid AND j.lease_token = mine.token",
     "WHERE j.scope_id = :sid AND j.event_id = :eid AND j.lease_token = :token"),
    ("WHERE r.scope_id = gone.scope_id AND r.event_id = gone.event_id",
     "WHERE r.scope_id = :sid AND r.event_id = :eid"),
    ("WHERE a.scope_id = gone.scope_id AND a.event_id = gone.event_id",
     "WHERE a.scope_id = :sid AND a.event_id = :eid"),
)


def _completion(*, one: bool) -> str:
    """Return the completion's CTEs for several items, or keyed by one item's key."""
    ctes = _COMPLETE_CTES.replace("{mine}", _MINE_ONE if one else _MINE_MANY)
    for joined, keyed in _KEYED_ONE if one else ():
        assert joined in ctes
        ctes = ctes.replace(joined, keyed)
    return ctes


def _complete(*, one: bool) -> TextualSelect:
    return text(
        "WITH" + _completion(one=one)
        + "\nSELECT count(*) AS held FROM gone"
    ).bindparams(bindparam("now", type_=UTCDateTime)).columns(column("held", Integer))


COMPLETE_SQL = _complete(one=False)
COMPLETE_ONE_SQL = _complete(one=True)  # the same completion of one item

# ... and the same statement claiming the next work items (never one it completes),
# so under a backlog a batch costs one commit, which also counts and leases the next
# items' attempts before their handlers run: a work item that kills its worker still
# spends its attempts, and the worker holds one batch of leases at a time.
_NEXT = """
SELECT (SELECT count(*) FROM gone) AS held,
       next.scope_id, next.event_id, next.event_type, next.accepted_at, next.attempts,
       next.lease_token, next.payload, next.number, next.receipt_accepted_at
FROM (SELECT) AS one LEFT JOIN (
    SELECT""" + _CLAIM_COLUMNS + _CLAIM_FROM + """
) AS next ON true"""
_NOT_MINE = ("\n      AND NOT EXISTS (SELECT FROM mine"
             "\n                      WHERE mine.sid = jobs.scope_id AND mine.eid = jobs.event_id)")


def _complete_and_claim(*, one_done: bool, one_next: bool) -> TextualSelect:
    return text(
        "WITH" + _completion(one=one_done)
        + "," + _claim_ctes(one=one_next, due=_NOT_MINE) + _NEXT
    ).bindparams(*(bindparam(name, type_=UTCDateTime) for name in _TIMES)).columns(
        column("held", Integer), *_CLAIM_RESULT)


COMPLETE_AND_CLAIM_SQL = _complete_and_claim(one_done=False, one_next=False)

# The hold and the completion run on the driver connection inside the handlers'
# transaction: SQLAlchemy's execution setup and result machinery cost more client
# CPU per transaction than the driver call itself. Keyed by (one item completed,
# one item claimed next): a round of one builds each from the same template as a
# batch's, without the steps one item does not need.
DRIVER_HOLD = DriverStatement(HOLD_SQL, what="worker hold")
DRIVER_COMPLETE = DriverStatement(COMPLETE_SQL, what="worker completion")
DRIVER_COMPLETE_ONE = DriverStatement(COMPLETE_ONE_SQL, what="worker completion")
DRIVER_COMPLETE_AND_CLAIM = {
    (one_done, one_next): DriverStatement(
        COMPLETE_AND_CLAIM_SQL if not (one_done or one_next)
        else _complete_and_claim(one_done=one_done, one_next=one_next),
        what="worker completion")
    for one_done in (False, True) for one_next in (False, True)}
