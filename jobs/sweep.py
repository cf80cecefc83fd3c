"""Stuck-work and integrity sweep: record what needs an operator as `findings` rows.

Kinds of finding (subject `"<account>/<integration>:<event_id>"`):
- `lease_expired`: a queued work item was claimed, its lease ran out more than a lease
  ago, and no worker took it over (are the workers running?).
- `overdue`: a queued work item was due more than LEDGER_STUCK_PENDING_SECONDS ago.
- `pending_without_job`: a pending receipt has no work item, so nothing will ever
  finish it (integrity: receipt and work item are written in one transaction).
  (The kinds are stored names and keep the `jobs` table's word.)
- `job_without_receipt`: a work item whose receipt is gone (integrity).
- `job_of_complete_receipt`: a work item still queued for a receipt already complete.
A finding no longer true is resolved (resolved_at); one that comes back reopens.
The sweep also marks scheduler runs whose holder died (their lease ran out) abandoned,
and corrects the stored failure groups (ledger.worker.failure_groups) a bounded step at
a time: each run checks the next MEMBERS_PER_RUN members and SIGNATURES_PER_RUN group
texts after where the last run stopped (`sweep_marks`), wrapping at the end.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, select, update

from ledger.clock import Clock
from ledger.config import Settings
from ledger.db.engine import conflict_insert
from ledger.db.schema import findings, integrations, jobs, receipts, sweep_marks
from ledger.domain import JobStatus, ReceiptState
from ledger.scheduling.runs import ABANDONED_RUN_GRACE_SECONDS, mark_abandoned_runs
from ledger.worker.failure_groups import sweep_members, sweep_signatures

KINDS = ("lease_expired", "overdue", "pending_without_job", "job_without_receipt",
         "job_of_complete_receipt")
# A backlog of a million stuck work items needs one alert, not a million rows.
MAX_FINDINGS_PER_KIND = 1000
# At one run a minute: 300,000 failure members an hour, every group text every few minutes.
MEMBERS_PER_RUN = 5000
SIGNATURES_PER_RUN = 1000

Found = dict[tuple[str, str], dict[str, Any]]


def run(engine: Engine, settings: Settings, clock: Clock) -> int:
    """Scheduled entry point: sweep and return the rows written."""
    return sweep(engine, settings, clock) + sweep_failure_groups(engine, clock)


def sweep_failure_groups(engine: Engine, clock: Clock, *, members: int = MEMBERS_PER_RUN,
                         signatures: int = SIGNATURES_PER_RUN) -> int:
    """Take members whose receipt left behind the requeue and purge out of their groups,
    then drop texts of groups left empty; one bounded step. Return the rows removed."""
    now = clock.now()
    with engine.begin() as conn:
        after = _mark(conn, "failure_members")
        member_at, dropped = sweep_members(conn, tuple(after) if after else None, members)
        _set_mark(conn, "failure_members", member_at, now)
        text_at, gone = sweep_signatures(conn, _mark(conn, "failure_signatures"), signatures)
        _set_mark(conn, "failure_signatures", text_at, now)
    return dropped + gone


def _mark(conn: Connection, name: str) -> Any:
    """Return where the sweep `name` stopped (None: at the start)."""
    position = conn.execute(select(sweep_marks.c.position)
                            .where(sweep_marks.c.name == name)).scalar()
    return None if position is None else json.loads(position)


def _set_mark(conn: Connection, name: str, position: Any, now: datetime) -> None:
    """Record where the sweep `name` goes on next time (None: back to the start)."""
    values = {"position": json.dumps(position), "swept_at": now}
    conn.execute(conflict_insert(conn, sweep_marks).values(name=name, **values)
                 .on_conflict_do_update(index_elements=["name"], set_=values))


def sweep(engine: Engine, settings: Settings, clock: Clock, *,
          abandoned_grace_seconds: float = ABANDONED_RUN_GRACE_SECONDS) -> int:
    """Find stuck and inconsistent work, upsert findings, resolve the stale ones."""
    now = clock.now()
    with engine.connect() as conn:
        found, capped = collect(conn, settings, now)
    with engine.begin() as conn:
        written = record_findings(conn, found, now)
        written += resolve_findings(conn, set(found), capped, now)
        written += mark_abandoned_runs(conn, now=now, grace_seconds=abandoned_grace_seconds)
    return written


def collect(conn: Connection, settings: Settings, now: datetime) -> tuple[Found, set[str]]:
    """Return the findings true right now, and the kinds whose list was cut at the cap."""
    scopes = {row.id: f"{row.account}/{row.name}" for row in conn.execute(
        select(integrations.c.id, integrations.c.account, integrations.c.name))}
    found: Found = {}
    capped: set[str] = set()
    for kind, query in _queries(settings, now).items():
        rows = conn.execute(query.limit(MAX_FINDINGS_PER_KIND + 1)).all()
        if len(rows) > MAX_FINDINGS_PER_KIND:
            capped.add(kind)
            rows = rows[:MAX_FINDINGS_PER_KIND]
        for row in rows:
            key = (kind, f"{scopes.get(row.scope_id, f'scope#{row.scope_id}')}:{row.event_id}")
            if key[0] == "overdue" and ("lease_expired", key[1]) in found:
                continue
            found[key] = _detail(row)
    return found, capped


def _detail(row: Any) -> dict[str, Any]:
    """Return the JSON detail of a finding (ids and times only, never a payload)."""
    detail: dict[str, Any] = {}
    for name, value in row._mapping.items():
        if name in ("scope_id", "event_id"):
            continue
        detail[name] = value.isoformat() if isinstance(value, datetime) else value
    return detail


def _queries(settings: Settings, now: datetime) -> dict[str, Any]:
    """Return the query of each finding kind; every one reads a small or indexed set."""
    queued = jobs.c.status == JobStatus.QUEUED.value
    lease_grace = now - timedelta(seconds=settings.lease_seconds)
    overdue_since = now - timedelta(seconds=settings.stuck_pending_seconds)
    job_cols = (jobs.c.scope_id, jobs.c.event_id, jobs.c.run_at, jobs.c.attempts)
    receipt_of_job = and_(receipts.c.scope_id == jobs.c.scope_id,
                          receipts.c.event_id == jobs.c.event_id)
    job_of_receipt = and_(jobs.c.scope_id == receipts.c.scope_id,
                          jobs.c.event_id == receipts.c.event_id)
    return {
        # A claim sets run_at to the lease end; a worker that reschedules moves
        # run_at past it. run_at <= leased_until therefore means "claimed, never
        # rescheduled, never finished".
        "lease_expired": select(*job_cols, jobs.c.leased_by, jobs.c.leased_until).where(
            queued, jobs.c.leased_until.is_not(None), jobs.c.leased_until < lease_grace,
            jobs.c.run_at <= jobs.c.leased_until).order_by(jobs.c.run_at),
        "overdue": select(*job_cols).where(queued, jobs.c.run_at < overdue_since)
        .order_by(jobs.c.run_at),
        "pending_without_job": select(receipts.c.scope_id, receipts.c.event_id,
                                      receipts.c.accepted_at)
        .where(receipts.c.state == ReceiptState.PENDING.code,
               ~select(jobs.c.scope_id).where(job_of_receipt).exists())
        .order_by(receipts.c.accepted_at),
        "job_without_receipt": select(*job_cols, jobs.c.status)
        .where(~select(receipts.c.scope_id).where(receipt_of_job).exists())
        .order_by(jobs.c.accepted_at),
        "job_of_complete_receipt": select(*job_cols).join(receipts, receipt_of_job)
        .where(queued, receipts.c.state == ReceiptState.COMPLETE.code)
        .order_by(jobs.c.accepted_at),
    }


def record_findings(conn: Connection, found: Found, now: datetime) -> int:
    """Upsert every current finding; a resolved one that recurs starts over."""
    if not found:
        return 0
    stmt = conflict_insert(conn, findings)
    reopened = findings.c.resolved_at.is_not(None)
    stmt = stmt.on_conflict_do_update(
        index_elements=["kind", "subject"],
        set_={"last_seen": stmt.excluded.last_seen, "detail": stmt.excluded.detail,
              "first_seen": case((reopened, stmt.excluded.first_seen),
                                 else_=findings.c.first_seen),
              "resolved_at": None},
    )
    rows = [{"kind": kind, "subject": subject, "detail": json.dumps(detail, sort_keys=True),
             "first_seen": now, "last_seen": now, "resolved_at": None}
            for (kind, subject), detail in found.items()]
    conn.execute(stmt, rows)
    return len(rows)


def resolve_findings(conn: Connection, current: set[tuple[str, str]], capped: set[str],
                     now: datetime) -> int:
    """Resolve open findings of the sweep's kinds that were not seen this time."""
    kinds = [k for k in KINDS if k not in capped]  # a capped list proves nothing absent
    open_rows = conn.execute(
        select(findings.c.id, findings.c.kind, findings.c.subject)
        .where(findings.c.kind.in_(kinds), findings.c.resolved_at.is_(None))
    ).all()
    gone = [row.id for row in open_rows if (row.kind, row.subject) not in current]
    if gone:
        conn.execute(update(findings).where(findings.c.id.in_(gone)).values(resolved_at=now))
    return len(gone)

