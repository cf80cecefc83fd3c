"""Representative ledger data at any scale: scopes, receipts, jobs, attempts, conflicts.

The same rows at 50 receipts (dashboard tests, both engines) and at 1,000,000
(benchmarks): ids are `evt_` + 24 base62 characters, states are mixed the way a
running ledger holds them (the newest receipts still pending, a few stuck, about
1 % failed after every attempt, the rest complete), receipts arrive in time order
with random ids (so the primary key fills like it does in production), and the
history rows (attempts, conflicts, audit entries) the operator pages show exist.

PostgreSQL loads through COPY; SQLite through executemany. Both write the same
rows for the same `DataSpec`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, select

from ledger.access import audit
from ledger.access.integrations import create_integration
from ledger.access.secrets_box import SecretBox
from ledger.db.schema import (
    attempts,
    conflicts,
    failure_members,
    failure_signatures,
    jobs,
    receipts,
)
from ledger.domain import ConflictKind, Integration, JobStatus, ReceiptState
from ledger.ids import BASE62
from ledger.worker.failure_groups import error_signature, group_id, rebuild_counters

# (event type, weight): what a Stripe-like sender plus the demo handler emits.
EVENT_TYPES = (
    ("demo.credit", 40), ("invoice.paid", 20), ("charge.succeeded", 15),
    ("payment_intent.succeeded", 15), ("customer.subscription.updated", 10),
)
NO_HANDLER = "ignored:no-handler"
FAIL_ERROR = "DemoFailure: demo.fail always fails"
CHUNK = 5_000


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """How much data, over how many scopes and how long, with which mix of states."""

    receipts: int
    scopes: int
    end: datetime = field(default_factory=lambda: datetime.now(UTC))
    span: timedelta = timedelta(days=7)
    pending_share: float = 0.02
    failed_share: float = 0.01
    stuck_share: float = 0.0005
    conflict_share: float = 0.001
    history: bool = True
    seed: int = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Generated:
    """What was written, for assertions and for pages to look up."""

    scopes: tuple[Integration, ...]
    by_state: dict[ReceiptState, int]
    attempts: int
    jobs: int
    conflicts: int
    samples: dict[ReceiptState, tuple[int, str]]


@dataclass(slots=True)
class _Rows:
    """One chunk of rows per table, as dicts keyed by column name."""

    receipts: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    failure_members: list[dict[str, Any]] = field(default_factory=list)


def event_id(rng: random.Random) -> str:
    """Return a representative event id: `evt_` + 24 base62 characters."""
    return "evt_" + "".join(rng.choices(BASE62, k=24))


def create_scopes(engine: Engine, box: SecretBox, count: int, *, now: datetime,
                  profile: str = "standard-webhooks", prefix: str = "acct") -> list[Integration]:
    """Create `count` integrations (one scope each) with a credential and an audit entry."""
    actor = audit.Actor(name="bench:datagen", role="admin")
    made = []
    with engine.begin() as conn:
        for i in range(count):
            integration, _ = create_integration(
                conn, box, actor, account=f"{prefix}-{i:06d}", name="stripe-prod",
                profile=profile, now=now)
            made.append(integration)
    return made


def generate(engine: Engine, box: SecretBox, spec: DataSpec) -> Generated:
    """Create the scopes, then load the receipts and their history."""
    scopes = create_scopes(engine, box, spec.scopes, now=spec.end - spec.span)
    return load(engine, spec, scopes)


def load(engine: Engine, spec: DataSpec, scopes: list[Integration]) -> Generated:
    """Write the spec's receipts (and history) for existing scopes, chunk by chunk."""
    by_state = dict.fromkeys(ReceiptState, 0)
    totals = {"attempts": 0, "jobs": 0, "conflicts": 0}
    samples: dict[ReceiptState, tuple[int, str]] = {}
    for chunk in _chunks(spec, [s.id for s in scopes]):
        for row in chunk.receipts:
            state = ReceiptState.from_code(row["state"])
            by_state[state] += 1
            samples.setdefault(state, (row["scope_id"], row["event_id"]))
        for name in totals:
            totals[name] += len(getattr(chunk, name))
        _write(engine, chunk)
    _count_failure_groups(engine, spec)
    return Generated(scopes=tuple(scopes), by_state=by_state, samples=samples, **totals)


def _write(engine: Engine, chunk: _Rows) -> None:
    """Write one chunk in one transaction (COPY on PostgreSQL)."""
    tables: list[tuple[Table, list[dict[str, Any]]]] = [
        (receipts, chunk.receipts), (jobs, chunk.jobs), (attempts, chunk.attempts),
        (conflicts, chunk.conflicts), (failure_members, chunk.failure_members)]
    with engine.begin() as conn:
        for table, rows in tables:
            if not rows:
                continue
            if conn.dialect.name == "postgresql":
                copy_rows(conn.connection.driver_connection, table.name, rows)
            else:
                conn.execute(table.insert(), rows)


def _failure_error(spec: DataSpec) -> str | None:
    """Return the last error a generated failure carries (none without history)."""
    return FAIL_ERROR if spec.history else None


def _count_failure_groups(engine: Engine, spec: DataSpec) -> None:
    """Name the failure groups of the generated failures and count them per scope."""
    with engine.begin() as conn:
        known = set(conn.execute(select(failure_signatures.c.id)).scalars())
        for event_type, _ in EVENT_TYPES:
            signature = error_signature(_failure_error(spec))
            gid = group_id(event_type, signature)
            if gid not in known:
                conn.execute(failure_signatures.insert().values(
                    id=gid, event_type=event_type, signature=signature,
                    example=_failure_error(spec), first_seen=spec.end - spec.span))
        rebuild_counters(conn)


def copy_rows(dbapi_conn: Any, table: str, rows: list[dict[str, Any]]) -> None:
    """COPY dict rows (all with the same keys) into `table` through psycopg."""
    columns = list(rows[0])
    with dbapi_conn.cursor() as cur, cur.copy(
            f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([row[c] for c in columns])


def _chunks(spec: DataSpec, scope_ids: list[int]) -> Iterator[_Rows]:
    """Yield the spec's rows in accepted_at order, CHUNK receipts at a time."""
    rng = random.Random(spec.seed)
    types = [t for t, _ in EVENT_TYPES]
    weights = [w for _, w in EVENT_TYPES]
    step = spec.span / max(spec.receipts, 1)
    start = spec.end - spec.span
    recent_pending = int(spec.receipts * spec.pending_share)
    balances = dict.fromkeys(scope_ids, 0)
    rows = _Rows()
    for i in range(spec.receipts):
        accepted = start + step * i
        if i >= spec.receipts - recent_pending:
            state = ReceiptState.PENDING
        else:
            state = _old_state(rng, spec)
        scope_id = rng.choice(scope_ids)
        event_type = rng.choices(types, weights)[0]
        _add_receipt(rows, rng, spec, scope_id=scope_id, event_type=event_type,
                     state=state, accepted=accepted, balances=balances)
        if len(rows.receipts) >= CHUNK:
            yield rows
            rows = _Rows()
    if rows.receipts:
        yield rows


def _old_state(rng: random.Random, spec: DataSpec) -> ReceiptState:
    """Pick the state of a receipt older than the pending tail."""
    u = rng.random()
    if u < spec.failed_share:
        return ReceiptState.FAILED
    if u < spec.failed_share + spec.stuck_share:
        return ReceiptState.PENDING
    return ReceiptState.COMPLETE


def _add_receipt(rows: _Rows, rng: random.Random, spec: DataSpec, *, scope_id: int,
                 event_type: str, state: ReceiptState, accepted: datetime,
                 balances: dict[int, int]) -> None:
    """Append one receipt with the job, attempts and conflict its state implies."""
    eid = event_id(rng)
    digest = rng.randbytes(32)
    n_attempts = _attempt_count(rng, state)
    done = accepted + timedelta(milliseconds=rng.randint(20, 2000))
    result_ref = None
    if state is ReceiptState.COMPLETE:
        if event_type == "demo.credit":
            balances[scope_id] += 1
            result_ref = f"credit:{balances[scope_id]}"
        else:
            result_ref = NO_HANDLER
    rows.receipts.append({
        "accepted_at": accepted,
        "completed_at": None if state is ReceiptState.PENDING else done,
        "scope_id": scope_id, "state": state.code, "attempts": n_attempts, "event_id": eid,
        "event_type": event_type, "body_sha256": digest, "result_ref": result_ref})
    if state is ReceiptState.FAILED:
        rows.failure_members.append({
            "scope_id": scope_id, "event_id": eid, "failed_at": done,
            "group_id": group_id(event_type, error_signature(_failure_error(spec)))})
    if not spec.history:
        return
    if state is not ReceiptState.COMPLETE:
        _add_job(rows, scope_id, eid, event_type, state, accepted, n_attempts)
    _add_attempts(rows, scope_id, eid, state, accepted, n_attempts)
    if state is ReceiptState.COMPLETE and rng.random() < spec.conflict_share:
        rows.conflicts.append({
            "scope_id": scope_id, "event_id": eid, "kind": ConflictKind.DIFFERENT_BODY.value,
            "original_event_id": eid, "original_sha256": digest,
            "incoming_sha256": rng.randbytes(32), "first_seen": done, "last_seen": done,
            "count": rng.randint(1, 3)})


def _attempt_count(rng: random.Random, state: ReceiptState) -> int:
    """Return how many attempts a receipt in `state` has used."""
    if state is ReceiptState.FAILED:
        return 8
    if state is ReceiptState.PENDING:
        return 0
    return rng.choices((1, 2, 3), (90, 8, 2))[0]


def _add_job(rows: _Rows, scope_id: int, eid: str, event_type: str, state: ReceiptState,
             accepted: datetime, n_attempts: int) -> None:
    """Append the queued (pending) or failed job that still carries the payload."""
    body = json.dumps({"type": event_type, "data": {"amount": 1, "id": eid}},
                      separators=(",", ":"))
    rows.jobs.append({
        "scope_id": scope_id, "event_id": eid, "event_type": event_type,
        "accepted_at": accepted, "run_at": accepted,
        "status": (JobStatus.FAILED if state is ReceiptState.FAILED else JobStatus.QUEUED).value,
        "attempts": n_attempts, "lease_token": n_attempts, "leased_by": None,
        "leased_until": None, "payload": body})


def _add_attempts(rows: _Rows, scope_id: int, eid: str, state: ReceiptState,
                  accepted: datetime, n_attempts: int) -> None:
    """Append one attempts row per attempt; the last carries the outcome."""
    for number in range(1, n_attempts + 1):
        last = number == n_attempts
        outcome = "retry"
        if last:
            outcome = "complete" if state is ReceiptState.COMPLETE else "failed"
        started = accepted + timedelta(seconds=10 * (number - 1))
        rows.attempts.append({
            "scope_id": scope_id, "event_id": eid, "number": number,
            "worker_id": "bench-host:4242:datagen", "lease_token": number,
            "started_at": started, "finished_at": started + timedelta(milliseconds=15),
            "outcome": outcome, "error": None if outcome == "complete" else FAIL_ERROR})
