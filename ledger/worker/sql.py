"""PostgreSQL's hot worker statements; the completions are sent on the driver connection.

The claim (`CLAIM_SQL`) and the completion (`COMPLETE_SQL`, or
`COMPLETE_AND_CLAIM_SQL` inside a worker's loop) are one statement each on
PostgreSQL (data-modifying CTEs); `ledger.worker.store` uses them and runs
SQLite's plain statements instead. Bind names differ from column names, as in
worker_store. Each statement keys its rows by scope, except the claim's pick of
the oldest due job (README, "Scaling past one database").
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Integer,
    Text,
    bindparam,
    column,
    text,
)

from ledger.db.driver import DriverStatement
from ledger.db.schema import UTCDateTime

_TIMES = ("now", "leased_until", "oldest_window")

# PostgreSQL claim: worker_store.due_job_query + lease_job in one round trip. `due` locks the
# job (same clauses and reasons as due_job_query; {due} adds the conditions of
# COMPLETE_AND_CLAIM_SQL); `counted` counts the attempt on the receipt
# unless the job may not start (out of attempts or too old: the worker then
# ends it with fail_unstarted) or its receipt is gone; `leased` writes the new
# fencing token and pushes run_at to the lease's end; `opened` starts this
# attempt's row. A job that had attempts in its window may have one whose
# worker vanished: the caller closes it right after (worker_store._claim_of), outside
# this statement, which runs once per job: the extra UPDATE here cost every
# claim ~0.1 ms of PostgreSQL CPU (bench/README.md, "Workers").
_CLAIM_CTES = """
due AS MATERIALIZED (
    SELECT scope_id, event_id, event_type, accepted_at, attempts, lease_token, payload
    FROM jobs
    WHERE status = 0 AND run_at <= :now{due}
    ORDER BY run_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), counted AS (
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
    FROM due, counted
    RETURNING 1
)"""
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

CLAIM_SQL = text(
    "WITH" + _CLAIM_CTES.format(due="") + "\nSELECT" + _CLAIM_COLUMNS
    + "\nFROM due LEFT JOIN counted ON true"
).bindparams(*(bindparam(name, type_=UTCDateTime) for name in _TIMES)).columns(*_CLAIM_RESULT)

# PostgreSQL completion after the handler, in one statement. `gone` is the fence:
# the job goes only while our token is still its token, so a worker whose lease
# was taken over deletes nothing, and its caller rolls back (the handler's
# writes too). The receipt and the attempt join `gone` (0 or 1 row): they
# change only after it and only if it held; each names its row by scope and
# id. A job row is locked before its receipt here as in every other writer, so
# two completions cannot deadlock on them.
_COMPLETE_CTES = """
gone AS (
    DELETE FROM jobs
    WHERE scope_id = :sid AND event_id = :eid AND lease_token = :token AND status = 0
    RETURNING scope_id, event_id
), done AS (
    UPDATE receipts r SET state = :complete, completed_at = :now, result_ref = :result_ref
    FROM gone WHERE r.scope_id = :sid AND r.event_id = :eid
    RETURNING 1
), closed AS (
    UPDATE attempts a SET finished_at = :now, outcome = 'complete', error = NULL
    FROM gone WHERE a.scope_id = :sid AND a.event_id = :eid
      AND a.number = :number AND a.lease_token = :token
    RETURNING 1
)"""
COMPLETE_SQL = text(
    "WITH" + _COMPLETE_CTES + "\nSELECT count(*) AS held FROM gone"
).bindparams(bindparam("now", type_=UTCDateTime)).columns(column("held", Integer))

# The completion that also claims the next due job (the claim CTEs, never the
# job just finished, and only if the fence held), so that claim commits with
# this completion: one commit per job instead of two. The next attempt is
# still counted and leased in a commit of its own before its handler runs,
# which is all the separate claim commit was for: a job that kills its worker
# still spends its attempts, and the worker holds one lease at a time.
COMPLETE_AND_CLAIM_SQL = text(
    "WITH" + _COMPLETE_CTES + "," + _CLAIM_CTES.format(
        due="\n      AND EXISTS (SELECT FROM gone)"
            "\n      AND NOT (scope_id = :sid AND event_id = :eid)")
    + "\nSELECT (SELECT count(*) FROM gone) AS held," + _CLAIM_COLUMNS
    + "\nFROM (SELECT) AS one LEFT JOIN due ON true LEFT JOIN counted ON true"
).bindparams(*(bindparam(name, type_=UTCDateTime) for name in _TIMES)).columns(
    column("held", Integer), *_CLAIM_RESULT)

# Sent on the driver connection inside the handler's transaction (ledger.db.driver):
# on the driver the worker's client CPU per job fell by about a sixth
# (bench/README.md, "Workers"). Both always return one row.
DRIVER_COMPLETE = DriverStatement(COMPLETE_SQL, what="worker completion")
DRIVER_COMPLETE_AND_CLAIM = DriverStatement(COMPLETE_AND_CLAIM_SQL, what="worker completion")
