"""The statements of a batched worker (LEDGER_WORKER_BATCH > 1). Functions take `conn`.

A batch is claimed in one statement (PostgreSQL `CLAIM_BATCH_SQL`; SQLite the
single claim's steps per job inside its BEGIN IMMEDIATE), held for the length
of one transaction (`hold_batch`), and its successful jobs are completed in one
statement at the end of that transaction (`complete_batch`), which inside the
worker's loop also claims the next batch. Each job keeps its own fencing
token, lease, attempt row and receipt, exactly as a single claim writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Integer, bindparam

from ledger.db.schema import jobs
from ledger.domain import ReceiptState
from ledger.worker.sql import (
    CLAIM_BATCH_SQL,
    DRIVER_COMPLETE_BATCH,
    DRIVER_COMPLETE_BATCH_AND_CLAIM,
    DRIVER_HOLD_BATCH,
)
from ledger.worker.store import (
    Claim,
    ClaimedJob,
    ClaimRequest,
    _claim_of,
    _due,
    _lease_due,
    complete_job,
    due_job_query,
    hold_lease,
)

# SQLite's batch pick: the claim query for up to :batch rows, with what tells
# whether a job must run alone (see sql._BATCH_CLAIM_CTES).
_DUE_BATCH = (due_job_query().add_columns(jobs.c.leased_by)
              .limit(bindparam("batch", type_=Integer)))


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRequest:
    """A claim of up to `size` jobs; jobs of `alone_types` (and suspects) come alone."""

    claim: ClaimRequest
    size: int
    alone_types: tuple[str, ...]

    def params(self) -> dict[str, Any]:
        """Return the batch claim statement's parameters."""
        return {**self.claim.params(), "batch": self.size,
                "alone_types": text_array(self.alone_types)}


# The batch statements take their per-job values as arrays (`CAST(:sids AS bigint[])`),
# each bound as ONE text parameter holding PostgreSQL's array literal: psycopg's list
# adapter inspects and dumps every element in Python, which costs a third of these
# statements' client CPU. Still bound
# parameters: PostgreSQL parses the literal as array input, never as SQL.
def int_array(values: Iterable[int]) -> str:
    """Return the array literal of integers, e.g. {1,2,3}."""
    return "{" + ",".join(str(int(value)) for value in values) + "}"


def text_array(values: Iterable[str]) -> str:
    """Return the array literal of strings, each quoted: {"a","b\\"c"}."""
    return "{" + ",".join('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for value in values) + "}"


def claim_batch(conn: Connection, request: BatchRequest) -> list[Claim]:
    """Lease up to `request.size` due jobs, oldest first; [] when none is due.

    A job that may not start comes back as (due, None), as from claim_next.
    """
    if conn.dialect.name == "postgresql":
        rows = conn.execute(CLAIM_BATCH_SQL, request.params()).all()
        return _claims_of(conn, rows, request.claim)
    rows = conn.execute(_DUE_BATCH, {"now": request.claim.now, "batch": request.size}).all()
    claims: list[Claim] = []
    for place, row in enumerate(rows):
        alone = row.leased_by is not None or row.event_type in request.alone_types
        if place > 0 and alone:
            continue  # it comes alone in a later claim
        claim = _lease_due(conn, _due(row), request.claim)
        if claim is not None:
            claims.append(claim)
        if place == 0 and alone:
            break
    return claims


def _claims_of(conn: Connection, rows: Sequence[Any], request: ClaimRequest) -> list[Claim]:
    """Return the claims of a batch claim's rows (lost attempts closed on the way)."""
    claims = [_claim_of(conn, row, request) for row in rows]
    return [claim for claim in claims if claim is not None]


def hold_batch(conn: Connection, batch: list[ClaimedJob]) -> set[tuple[int, str]]:
    """Lock the batch's jobs whose token is still ours; return their keys.

    Until the transaction ends no claim can take them, expired lease or not.
    SQLite: BEGIN IMMEDIATE already excludes every other writer; the tokens
    are checked one by one.
    """
    if conn.dialect.name == "postgresql":
        rows = DRIVER_HOLD_BATCH.rows(conn, {
            "sids": int_array(job.scope_id for job in batch),
            "eids": text_array(job.event_id for job in batch),
            "tokens": int_array(job.lease_token for job in batch)})
        return {(int(row.scope_id), str(row.event_id)) for row in rows}
    return {(job.scope_id, job.event_id) for job in batch if hold_lease(conn, job)}


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchCompletion:
    """What complete_batch did: how many jobs it ended, and the next batch if asked."""

    completed: int
    next: list[Claim]


def complete_batch(conn: Connection, done: list[tuple[ClaimedJob, str]], *, now: Any,
                   then_claim: BatchRequest | None = None) -> BatchCompletion:
    """End every (job, result_ref) of `done` (receipt complete, job gone), fenced by token.

    With `then_claim`, the next batch is claimed in the same transaction.
    """
    if conn.dialect.name != "postgresql":
        completed = sum(complete_job(conn, job, result_ref=ref, now=now).held
                        for job, ref in done)
        return BatchCompletion(completed=completed,
                               next=claim_batch(conn, then_claim) if then_claim else [])
    params: dict[str, Any] = {
        "sids": int_array(job.scope_id for job, _ in done),
        "eids": text_array(job.event_id for job, _ in done),
        "tokens": int_array(job.lease_token for job, _ in done),
        "numbers": int_array(job.number for job, _ in done),
        "refs": text_array(ref for _, ref in done),
        "now": now, "complete": ReceiptState.COMPLETE.code}
    if then_claim is None:
        return BatchCompletion(completed=int(DRIVER_COMPLETE_BATCH.row(conn, params).held),
                               next=[])
    rows = DRIVER_COMPLETE_BATCH_AND_CLAIM.rows(conn, {**then_claim.params(), **params})
    return BatchCompletion(completed=int(rows[0].held),
                           next=_claims_of(conn, rows, then_claim.claim))
