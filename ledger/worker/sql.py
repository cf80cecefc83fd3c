"""PostgreSQL's hot worker statements, and the runner that sends them on the driver connection.

The claim (`CLAIM_SQL`) and the completion (`COMPLETE_SQL`, or
`COMPLETE_AND_CLAIM_SQL` inside a worker's loop) are one statement each on
PostgreSQL (data-modifying CTEs); `ledger.worker.store` uses them and runs
SQLite's plain statements instead. Bind names differ from column names, as in
worker_store. Each statement keys its rows by scope, except the claim's pick of
the oldest due job (README, "Scaling past one database").
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Dialect,
    Integer,
    Text,
    TextualSelect,
    bindparam,
    column,
    text,
)

from ledger.db.engine import driver_error
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



class DriverStatement:
    """A hot PostgreSQL statement run on the driver connection, in the caller's transaction.

    The completion runs once per job, and SQLAlchemy's execution machinery
    (execution context, cursor result, row objects) cost about as much Python
    as the driver call itself; on the driver the worker's client CPU per job
    fell by about a sixth (bench/README.md, "Workers"), as the intake's did
    with store.DriverClaim. The statement still runs inside the transaction
    the handler's writes are in (the same pooled connection). Parameters and
    rows get the same conversions as through SQLAlchemy (timestamps in UTC);
    driver errors are raised as SQLAlchemy's, without parameters, and a
    broken connection is invalidated, as SQLAlchemy would.
    """

    def __init__(self, statement: TextualSelect) -> None:
        self.statement = statement
        self._compiled: dict[str, tuple[str, Any, Any]] = {}  # per dialect name

    def sql(self, dialect: Dialect) -> str:
        """Return the statement as the driver receives it."""
        return self._prepared(dialect)[0]

    def _prepared(self, dialect: Dialect) -> tuple[str, Any, Any]:
        """Return (SQL, parameter converter, row converter) for `dialect`, built once."""
        found = self._compiled.get(dialect.name)
        if found is None:
            compiled = self.statement.compile(dialect=dialect)
            times = [name for name, bind in compiled.binds.items()
                     if isinstance(bind.type, UTCDateTime)]
            to_driver = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
            columns = [(col.key, col.type) for col in self.statement.selected_columns]
            # why: the fields are the statement's columns, known only at run time; mypy
            # types a namedtuple only from a literal list of fields.
            shape = namedtuple("DriverRow", [key for key, _ in columns])  # type: ignore[misc]
            processors = [(i, kind.dialect_impl(dialect).result_processor(dialect, None))
                          for i, (_, kind) in enumerate(columns)]
            readers = [(i, read) for i, read in processors if read is not None]

            def params(values: dict[str, Any]) -> dict[str, Any]:
                if to_driver is not None:
                    values.update({name: to_driver(values[name]) for name in times})
                return values

            def row(values: Sequence[Any]) -> Any:
                if readers:
                    values = list(values)
                    for i, read in readers:
                        values[i] = read(values[i])
                return shape._make(values)

            found = self._compiled[dialect.name] = (compiled.string, params, row)
        return found

    def row(self, conn: Connection, params: dict[str, Any]) -> Any:
        """Run the statement with `params` (a dict it may change); return its one row."""
        sql, convert_params, convert_row = self._prepared(conn.dialect)
        fairy = conn.connection
        driver = fairy.driver_connection
        assert driver is not None  # a checked-out connection always has its driver's
        cursor = driver.cursor()
        try:
            cursor.execute(sql, convert_params(params))
            values = cursor.fetchone()
        except conn.dialect.loaded_dbapi.Error as error:
            raise driver_error(conn.dialect, error, what="worker completion",
                               dbapi_connection=fairy.dbapi_connection,
                               invalidate=conn.invalidate) from error
        finally:
            cursor.close()
        if values is None:
            raise RuntimeError("the completion statement returned no row")
        return convert_row(values)


DRIVER_COMPLETE = DriverStatement(COMPLETE_SQL)
DRIVER_COMPLETE_AND_CLAIM = DriverStatement(COMPLETE_AND_CLAIM_SQL)
