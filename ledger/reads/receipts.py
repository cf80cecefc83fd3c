"""Receipt lists (three index-shaped strategies), the receipt detail, one receipt by id."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, case, select, true, tuple_
from sqlalchemy.sql.elements import ColumnElement

from ledger import strict_json
from ledger.access.integrations import get_integration, get_integration_by_scope, scope_names
from ledger.db.schema import attempts, audit_log, conflicts, integrations, jobs, receipts
from ledger.domain import Integration, Receipt, ReceiptState
from ledger.errors import NotFound
from ledger.reads.cursor import BadCursor, Page, decode_cursor, encode_cursor
from ledger.reads.destinations import receipt_answers
from ledger.reads.models import (
    AttemptRow,
    ConflictItem,
    DeliveryItem,
    FailureItem,
    ReceiptAuditItem,
    ReceiptDetail,
    ReceiptItem,
    WorkItemState,
)

DEFAULT_LIMIT = 50
# Deeper stored payloads are shown as text: the pretty-printer recurses per level.
DISPLAY_MAX_DEPTH = 128
MAX_LIMIT = 200
# Time windows start small and grow: the first page of a busy ledger reads one
# minute of receipts through the btree on accepted_at, a quiet one widens until it fills.
FIRST_WINDOW = timedelta(seconds=60)
WINDOW_GROWTH = 4
MAX_WINDOWS = 16
FUTURE_SLACK = timedelta(hours=1)
# No receipt is older than this; the last window stops here instead of overflowing.
OLDEST_POSSIBLE = datetime(2000, 1, 1, tzinfo=UTC)

LIST_COLUMNS = (receipts.c.scope_id, receipts.c.event_id, receipts.c.event_type,
                receipts.c.state, receipts.c.attempts, receipts.c.accepted_at,
                receipts.c.completed_at, receipts.c.result_ref)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptFilter:
    """What an operator asked to see; every field optional."""

    scope_id: int | None = None
    # Several scopes: every integration of one account (`scope_id IN (...)`, the primary key).
    scope_ids: tuple[int, ...] | None = None
    state: ReceiptState | None = None
    event_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    prefix: str | None = None


def filter_terms(f: ReceiptFilter) -> list[ColumnElement[bool]]:
    """Return the WHERE terms every strategy shares."""
    terms: list[ColumnElement[bool]] = []
    if f.scope_id is not None:
        terms.append(receipts.c.scope_id == f.scope_id)
    if f.scope_ids is not None:
        terms.append(receipts.c.scope_id.in_(f.scope_ids))
    if f.state is not None:
        terms.append(receipts.c.state == f.state.code)
        if f.state is not ReceiptState.COMPLETE:
            # Restates the partial index predicate so every planner sees it applies.
            terms.append(receipts.c.state != ReceiptState.COMPLETE.code)
    if f.event_type:
        terms.append(receipts.c.event_type == f.event_type)
    if f.since is not None:
        terms.append(receipts.c.accepted_at >= f.since)
    if f.until is not None:
        terms.append(receipts.c.accepted_at < f.until)
    return terms


def newest_first(stmt: Select[Any]) -> Select[Any]:
    """Order a receipt select newest first with a unique tiebreak."""
    return stmt.order_by(receipts.c.accepted_at.desc(), receipts.c.scope_id.desc(),
                         receipts.c.event_id.desc())


def time_cursor(cursor: str | None) -> tuple[datetime, int, str] | None:
    """Decode a newest-first cursor."""
    return None if cursor is None else decode_cursor(cursor, (datetime, int, str))


def before_key(key: tuple[datetime, int, str]) -> list[ColumnElement[bool]]:
    """Return terms selecting rows strictly after `key` in newest-first order."""
    at, scope_id, event_id = key
    # The plain bound lets the index range-scan; the row comparison breaks ties.
    return [receipts.c.accepted_at <= at,
            tuple_(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id)
            < tuple_(at, scope_id, event_id)]


def open_receipts_stmt(f: ReceiptFilter, key: tuple[datetime, int, str] | None,
                       limit: int) -> Select[Any]:
    """Pending or failed receipts newest first: the partial (state, accepted_at) index."""
    terms = filter_terms(f) + (before_key(key) if key else [])
    return newest_first(select(*LIST_COLUMNS).where(*terms)).limit(limit)


def window_stmt(f: ReceiptFilter, key: tuple[datetime, int, str] | None, lo: datetime,
                hi: datetime, limit: int) -> Select[Any]:
    """Receipts in [lo, hi) newest first: the btree on accepted_at, read backwards."""
    terms = [*filter_terms(f), receipts.c.accepted_at >= lo, receipts.c.accepted_at < hi]
    if key:
        terms += before_key(key)
    return newest_first(select(*LIST_COLUMNS).where(*terms)).limit(limit)


def prefix_bounds(prefix: str) -> tuple[str, str]:
    """Return [low, high) bounds of the ids starting with `prefix` (byte order)."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def prefix_stmt(f: ReceiptFilter, scope_ids: list[int] | None, after: tuple[int, str] | None,
                limit: int, *, lateral: bool = True) -> Select[Any]:
    """Receipts whose id starts with a prefix, scope by scope, by id within a scope.

    The order is the primary key's own, (scope_id, event_id), so a page reads one
    range per scope in index order and stops once it holds `limit` rows; ordered by
    event id across scopes instead, every match of every scope had to be read and
    sorted first (1/62 of the table for a one-character prefix). `scope_ids` None
    means every scope; `after` is the cursor's (scope id, event id).

    On PostgreSQL (`lateral`) the scopes come from the integrations' primary key and
    each one's range is a LATERAL subquery with its own LIMIT: a nested loop of
    index probes that stops at the page, even with 10,000 scopes and a prefix that
    matches nothing (one probe per scope, never the table). SQLite has no LATERAL:
    `scope_id IN (SELECT id FROM integrations)` gives it the same loop.
    """
    assert f.prefix
    low, high = prefix_bounds(f.prefix)
    escaped = f.prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    scopes = select(integrations.c.id)
    if scope_ids is not None:
        scopes = scopes.where(integrations.c.id.in_(scope_ids))
    if after is not None:
        scopes = scopes.where(integrations.c.id >= after[0])
    terms = [*filter_terms(f), receipts.c.event_id >= low, receipts.c.event_id < high,
             receipts.c.event_id.like(escaped + "%", escape="\\")]
    if not lateral:
        terms.append(receipts.c.scope_id.in_(scopes.scalar_subquery()))
        if after is not None:
            terms.append(tuple_(receipts.c.scope_id, receipts.c.event_id) > tuple_(*after))
        return (select(*LIST_COLUMNS).where(*terms)
                .order_by(receipts.c.scope_id, receipts.c.event_id).limit(limit))
    scope = scopes.subquery("prefix_scopes")
    terms.append(receipts.c.scope_id == scope.c.id)
    if after is not None:
        # Within the cursor's scope the range starts after its event id ('' elsewhere).
        terms.append(receipts.c.event_id > case((scope.c.id == after[0], after[1]), else_=""))
    per_scope = (select(*LIST_COLUMNS).where(*terms).order_by(receipts.c.event_id)
                 .limit(limit).lateral("prefix_rows"))
    return (select(*per_scope.c).select_from(scope.join(per_scope, true()))
            .order_by(scope.c.id, per_scope.c.event_id).limit(limit))


def list_receipts(conn: Connection, f: ReceiptFilter, *, now: datetime,
                  cursor: str | None = None, limit: int = DEFAULT_LIMIT) -> Page[ReceiptItem]:
    """Return one keyset page of receipts matching the filter."""
    limit = max(1, min(limit, MAX_LIMIT))
    if f.prefix:
        return _list_by_prefix(conn, f, cursor, limit)
    key = time_cursor(cursor)
    if f.state in (ReceiptState.PENDING, ReceiptState.FAILED):
        rows = list(conn.execute(open_receipts_stmt(f, key, limit + 1)))
    else:
        rows = _read_windows(conn, f, key, limit + 1, now)
    return _page(conn, rows, limit, lambda r: encode_cursor(r.accepted_at, r.scope_id,
                                                            r.event_id))


def _read_windows(conn: Connection, f: ReceiptFilter, key: tuple[datetime, int, str] | None,
                  want: int, now: datetime) -> list[Any]:
    """Read newest-first rows window by window until `want` rows or the oldest bound."""
    hi = key[0] + timedelta(microseconds=1) if key else (f.until or now + FUTURE_SLACK)
    width = FIRST_WINDOW
    rows: list[Any] = []
    for _ in range(MAX_WINDOWS):
        floor = f.since or OLDEST_POSSIBLE
        lo = hi - width if hi - floor > width else floor
        last = lo <= floor
        rows += conn.execute(window_stmt(f, key, lo, hi, want - len(rows))).all()
        if len(rows) >= want or last:
            break
        hi, width = lo, width * WINDOW_GROWTH
    return rows


def _list_by_prefix(conn: Connection, f: ReceiptFilter, cursor: str | None,
                    limit: int) -> Page[ReceiptItem]:
    """Page receipts by event id prefix, within one scope or across all, scope by scope."""
    key = None if cursor is None else decode_cursor(cursor, (int, str))
    if f.scope_id is not None:
        scope_ids: list[int] | None = [f.scope_id]
    else:
        scope_ids = None if f.scope_ids is None else sorted(f.scope_ids)
    if scope_ids == []:
        return Page()
    stmt = prefix_stmt(f, scope_ids, key, limit + 1,
                       lateral=conn.dialect.name == "postgresql")
    rows = list(conn.execute(stmt))
    return _page(conn, rows, limit, lambda r: encode_cursor(r.scope_id, r.event_id))


def receipt_item(row: Any, names: Mapping[int, tuple[str, str]]) -> ReceiptItem:
    """Turn a receipt row into the read model pages and the API show."""
    scope, public_id = names.get(row.scope_id, (str(row.scope_id), ""))
    return ReceiptItem(
        scope_id=row.scope_id, event_id=row.event_id, event_type=row.event_type,
        state=ReceiptState.from_code(row.state).value, attempts=row.attempts,
        accepted_at=row.accepted_at, completed_at=row.completed_at, result_ref=row.result_ref,
        scope=scope, integration=public_id)


def failure_item(row: Any, names: Mapping[int, tuple[str, str]]) -> FailureItem:
    """Turn a failed receipt's row (with its `last_error` column) into its read model."""
    return FailureItem(**receipt_item(row, names), last_error=row.last_error)


def _page(conn: Connection, rows: list[Any], limit: int,
          key_of: Any) -> Page[ReceiptItem]:
    """Cut rows to the page size and compute the next cursor."""
    more = len(rows) > limit
    rows = rows[:limit]
    names = scope_names(conn, {r.scope_id for r in rows})
    items = [receipt_item(r, names) for r in rows]
    return Page(items=items, next_cursor=key_of(rows[-1]) if more and rows else None)


def read_receipt(conn: Connection, public_id: str,
                 event_id: str) -> tuple[Integration, ReceiptDetail]:
    """Return a receipt's integration and detail; NotFound when either does not exist."""
    integration = get_integration(conn, public_id)
    item = receipt_detail(conn, integration.id, event_id)
    if item is None:
        raise NotFound("receipt", f"{integration.scope}:{event_id}")
    return integration, item


def receipt_detail(conn: Connection, scope_id: int, event_id: str) -> ReceiptDetail | None:
    """Return a receipt with its timeline, conflicts, audit rows and retained payload."""
    row = conn.execute(select(receipts).where(receipts.c.scope_id == scope_id,
                                              receipts.c.event_id == event_id)).first()
    if row is None:
        return None
    item = receipt_item(row, scope_names(conn, {scope_id}))
    attempt_rows = [AttemptRow(
        id=a.id, scope_id=a.scope_id, event_id=a.event_id, number=a.number,
        worker_id=a.worker_id, lease_token=a.lease_token, started_at=a.started_at,
        finished_at=a.finished_at, outcome=a.outcome, error=a.error) for a in conn.execute(
        select(attempts).where(attempts.c.scope_id == scope_id, attempts.c.event_id == event_id)
        .order_by(attempts.c.number, attempts.c.id))]
    work = conn.execute(select(jobs.c.status, jobs.c.run_at, jobs.c.leased_by,
                               jobs.c.leased_until, jobs.c.payload)
                        .where(jobs.c.scope_id == scope_id, jobs.c.event_id == event_id)).first()
    return ReceiptDetail(
        **item, body_sha256=bytes(row.body_sha256).hex(), attempt_rows=attempt_rows,
        last_error=last_error_of(row.state, [a["error"] for a in attempt_rows]),
        conflicts=_receipt_conflicts(conn, scope_id, event_id),
        audit=_receipt_audit(conn, item["scope"], event_id),
        deliveries=event_deliveries(conn, scope_id, event_id),
        destination_attempts=receipt_answers(conn, scope_id, event_id),
        job=None if work is None else WorkItemState(
            status=work.status, run_at=work.run_at, leased_by=work.leased_by,
            leased_until=work.leased_until),
        payload=pretty_payload(work.payload) if work is not None and work.payload else None)


def _receipt_conflicts(conn: Connection, scope_id: int, event_id: str) -> list[ConflictItem]:
    """Return the newest conflicts naming the event, as its own or as the original."""
    return [conflict_item(c) for c in conn.execute(
        select(*conflict_columns()).where(conflicts.c.scope_id == scope_id,
                                          (conflicts.c.event_id == event_id)
                                          | (conflicts.c.original_event_id == event_id))
        .order_by(conflicts.c.last_seen.desc()).limit(50))]


def _receipt_audit(conn: Connection, scope: str, event_id: str) -> list[ReceiptAuditItem]:
    """Return the newest audit rows about the event (targeted by id or scope:id)."""
    return [ReceiptAuditItem(id=a.id, at=a.at, actor=a.actor, role=a.role, action=a.action,
                             reason=a.reason) for a in conn.execute(
        select(audit_log.c.id, audit_log.c.at, audit_log.c.actor, audit_log.c.role,
               audit_log.c.action, audit_log.c.reason)
        .where(audit_log.c.scope == scope,
               audit_log.c.target.in_([event_id, f"{scope}:{event_id}"]))
        .order_by(audit_log.c.id.desc()).limit(50))]


def last_error_of(state: int, errors: list[str | None]) -> str | None:
    """Return the error a receipt presents: the newest one, unless it completed since.

    A complete receipt has none: the errors of its earlier attempts (a retry, a
    lost worker, a database error) were superseded; the attempt history keeps them.
    """
    if state == ReceiptState.COMPLETE.code:
        return None
    found = [error for error in errors if error]
    return found[-1] if found else None


def event_deliveries(conn: Connection, scope_id: int, event_id: str) -> list[DeliveryItem]:
    """Return the delivery log's rows of one event (imported late: deliveries imports us)."""
    from ledger.reads.deliveries import event_deliveries as read

    return read(conn, scope_id, event_id)


def payload_value(raw: str) -> Any:
    """Return a stored payload as a JSON value, or as its text when it is not strict JSON.

    Bodies stored before the intake was strict may nest ~1000 deep or hold 1e400:
    they are shown as text rather than breaking the page (RecursionError) or
    the API (an `Infinity` token).
    """
    try:
        return strict_json.loads(raw, DISPLAY_MAX_DEPTH)
    except strict_json.StrictJsonError:
        return raw


def pretty_payload(raw: str) -> str:
    """Pretty-print a stored JSON payload (left as is when it is not strict JSON)."""
    try:
        value = strict_json.loads(raw, DISPLAY_MAX_DEPTH)
    except strict_json.StrictJsonError:
        return raw
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def conflict_columns() -> list[Any]:
    """Return the conflict columns a list shows: the kept body only as a flag."""
    return [*(c for c in conflicts.c if c.name != "incoming_body"),
            conflicts.c.incoming_body.is_not(None).label("body_kept")]


def conflict_item(row: Any) -> ConflictItem:
    """Turn a conflict row into its read model: hex digests, the kept body only as a flag."""
    fields = row._mapping
    # The kept body is evidence for oncall (ledger.reads.evidence), never part of a list.
    kept = fields["body_kept"] if "body_kept" in fields else fields["incoming_body"] is not None
    return ConflictItem(
        id=row.id, scope_id=row.scope_id, event_id=row.event_id, kind=row.kind,
        original_event_id=row.original_event_id,
        original_sha256=bytes(row.original_sha256).hex(),
        incoming_sha256=bytes(row.incoming_sha256).hex(), first_seen=row.first_seen,
        last_seen=row.last_seen, count=row.count, acknowledged_at=row.acknowledged_at,
        acknowledged_by=row.acknowledged_by, ack_note=row.ack_note,
        incoming_size=row.incoming_size, body_kept=bool(kept))


__all__ = ["BadCursor", "ReceiptFilter", "list_receipts", "receipt_detail"]


def get_receipt(conn: Connection, scope: str, event_id: str) -> Receipt:
    """Return the receipt of (scope, event id) with its last error, or raise NotFound."""
    integration = get_integration_by_scope(conn, scope)
    row = conn.execute(
        select(receipts).where(receipts.c.scope_id == integration.id,
                               receipts.c.event_id == event_id)
    ).first()
    if row is None:
        raise NotFound("receipt", f"{scope}:{event_id}")
    last_error = None
    if row.state != ReceiptState.COMPLETE.code:  # a completion supersedes every error
        last_error = conn.execute(
            select(attempts.c.error)
            .where(attempts.c.scope_id == integration.id, attempts.c.event_id == event_id,
                   attempts.c.error.is_not(None))
            .order_by(attempts.c.number.desc(), attempts.c.id.desc()).limit(1)
        ).scalar()
    return Receipt(
        scope=integration.scope, event_id=row.event_id, event_type=row.event_type,
        state=ReceiptState.from_code(row.state), attempts=row.attempts,
        accepted_at=row.accepted_at, completed_at=row.completed_at,
        result_ref=row.result_ref, body_sha256=bytes(row.body_sha256).hex(),
        last_error=last_error,
    )
