"""Failure groups: terminal failures grouped by event type and error signature.

The signature is the last error's class and its message with the parts that vary
from one event to the next (numbers, uuids, hex digests, prefixed ids such as
`evt_123`) replaced by placeholders, so "amount 7 too big for acct_42" and
"amount 9 too big for acct_43" are one group. Groups are computed from the newest
GROUP_SCAN failures (the failed-state partial index, newest first), so the page
stays fast however many failures there are; when more exist the page says so.
A group's id is a digest of (event type, signature): stable across requests, it
keys the operator's acknowledgement or mute (`failure_groups`).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, tuple_

from ledger.db.schema import failure_groups, receipts
from ledger.domain import ReceiptState
from ledger.reads.receipts import ReceiptFilter, filter_terms, scope_names
from ledger.reads.work import _last_error, failures_filter

GROUP_SCAN = 1000
SIGNATURE_LIMIT = 300
_CLASS = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)(?::\s*|$)")
_VARYING = (  # most specific first: a uuid holds hex runs and numbers
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                r"[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"\b[A-Za-z]{1,12}_(?=[A-Za-z0-9]*\d)[A-Za-z0-9]+\b"), "<id>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "<n>"),
)


@functools.lru_cache(maxsize=4096)  # failures of one cause repeat one text: normalise it once
def error_signature(error: str | None) -> str:
    """Return the error's class and normalised message: what failures of one cause share."""
    text = " ".join((error or "").split())
    if not text:
        return "(no error recorded)"
    match = _CLASS.match(text)
    cls, message = (match.group(1), text[match.end():]) if match else ("Error", text)
    for pattern, placeholder in _VARYING:
        message = pattern.sub(placeholder, message)
    return f"{cls}: {message}"[:SIGNATURE_LIMIT] if message else cls


@functools.lru_cache(maxsize=4096)
def group_id(event_type: str, signature: str) -> str:
    """Return the stable id of the group of (event type, signature)."""
    return hashlib.sha256(f"{event_type}\x00{signature}".encode()).hexdigest()[:16]


@dataclass(slots=True, kw_only=True)
class FailureGroup:
    """Failures sharing an event type and an error signature."""

    id: str
    event_type: str
    signature: str
    count: int = 0
    first_seen: datetime | None = None  # when the first of them failed
    last_seen: datetime | None = None
    scopes: set[str] = field(default_factory=set)
    example: str | None = None  # one full last error, as stored
    state: str | None = None  # None, "acknowledged" or "muted"
    note: str | None = None
    updated_by: str | None = None
    updated_at: datetime | None = None

    def add(self, failed_at: datetime, scope: str, error: str | None) -> None:
        """Count one failure into the group."""
        self.count += 1
        self.first_seen = failed_at if self.first_seen is None else min(self.first_seen,
                                                                        failed_at)
        self.last_seen = failed_at if self.last_seen is None else max(self.last_seen, failed_at)
        self.scopes.add(scope)
        self.example = self.example or error


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureGroups:
    """The groups (largest first, muted ones apart), and how much was scanned."""

    groups: list[FailureGroup]
    muted: list[FailureGroup]
    scanned: int
    capped: bool  # more failures match than were scanned


def _failed_terms(conn: Connection, f: ReceiptFilter) -> list[Any]:
    """Return the WHERE terms of failures matching the filter, as each planner needs them.

    PostgreSQL proves the partial index's `state != complete` from `state = failed` by
    itself, and the restated term only makes it misestimate the rows and scan every
    failure; SQLite uses a partial index only when its predicate is restated.
    """
    terms = [receipts.c.state == ReceiptState.FAILED.code]
    if conn.dialect.name != "postgresql":
        terms.append(receipts.c.state != ReceiptState.COMPLETE.code)
    return terms + filter_terms(replace(f, state=None, prefix=None))


def _scan(conn: Connection, f: ReceiptFilter, limit: int) -> list[Any]:
    """Return the newest failures matching the filter with their last error."""
    # Newest first in the (state, accepted_at) partial index's own order, read backwards,
    # so the scan stops after `limit` rows; a tiebreak column would sort every failure.
    return list(conn.execute(
        select(receipts.c.scope_id, receipts.c.event_id, receipts.c.event_type,
               receipts.c.accepted_at, receipts.c.completed_at, _last_error())
        .where(*_failed_terms(conn, f))
        .order_by(receipts.c.state.desc(), receipts.c.accepted_at.desc()).limit(limit)).all())


def read_groups(conn: Connection, f: ReceiptFilter, *, scan: int = GROUP_SCAN) -> FailureGroups:
    """Group the newest `scan` failures matching the filter."""
    rows = _scan(conn, f, scan + 1)
    capped, rows = len(rows) > scan, rows[:scan]
    names = scope_names(conn, {r.scope_id for r in rows})
    groups: dict[str, FailureGroup] = {}
    for r in rows:
        signature = error_signature(r.last_error)
        key = group_id(r.event_type, signature)
        group = groups.setdefault(key, FailureGroup(id=key, event_type=r.event_type,
                                                    signature=signature))
        group.add(r.completed_at or r.accepted_at, names.get(r.scope_id, (str(r.scope_id),))[0],
                  r.last_error)
    _attach_state(conn, groups)
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.event_type, g.signature))
    return FailureGroups(groups=[g for g in ordered if g.state != "muted"],
                         muted=[g for g in ordered if g.state == "muted"],
                         scanned=len(rows), capped=capped)


def _attach_state(conn: Connection, groups: dict[str, FailureGroup]) -> None:
    """Copy each group's acknowledgement or mute onto it."""
    if not groups:
        return
    for row in conn.execute(select(failure_groups)
                            .where(failure_groups.c.id.in_(sorted(groups)))):
        group = groups[row.id]
        group.state, group.note = row.state, row.note
        group.updated_by, group.updated_at = row.updated_by, row.updated_at


def group_chunk(conn: Connection, f: ReceiptFilter, gid: str,
                after: tuple[datetime, int, str] | None, size: int
                ) -> tuple[list[tuple[datetime, int, str]], tuple[datetime, int, str] | None, int]:
    """Scan the next `size` matching failures oldest first; return the group's keys among them,
    the last key scanned (None when nothing was left) and how many were scanned."""
    terms = filter_terms(failures_filter(f))
    if after is not None:
        terms += [receipts.c.accepted_at >= after[0],
                  tuple_(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id)
                  > tuple_(*after)]
    rows = conn.execute(
        select(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id,
               receipts.c.event_type, _last_error()).where(*terms)
        .order_by(receipts.c.accepted_at, receipts.c.scope_id, receipts.c.event_id)
        .limit(size)).all()
    keys = [(r.accepted_at, r.scope_id, r.event_id) for r in rows
            if group_id(r.event_type, error_signature(r.last_error)) == gid]
    last = (rows[-1].accepted_at, rows[-1].scope_id, rows[-1].event_id) if rows else None
    return keys, last, len(rows)


def count_group(conn: Connection, f: ReceiptFilter, gid: str, *, cap: int) -> tuple[int, bool]:
    """Count the failures of one group matching the filter, scanning at most `cap`."""
    rows = _scan(conn, f, cap + 1)
    count = sum(1 for r in rows[:cap]
                if group_id(r.event_type, error_signature(r.last_error)) == gid)
    return count, len(rows) > cap
