"""Failure groups: terminal failures grouped by event type and error signature.

Each failure's group is stored when it fails (ledger.worker.failure_groups), with a
counter per (group, scope), so the groups of every failure read those counters: a
few rows per group and scope, however many failures there are. A time window
(since/until) cannot be read from counters: the groups of a window are counted from
the window's failures (newest first through the failed-state index, joined to their
stored group), up to WINDOW_SCAN of them, and the page says when there were more.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, func, select, tuple_

from ledger.db.schema import (
    failure_group_scopes,
    failure_groups,
    failure_members,
    failure_signatures,
    receipts,
)
from ledger.domain import ReceiptState
from ledger.reads.receipts import ReceiptFilter, filter_terms, scope_names
from ledger.worker.failure_groups import error_signature, group_id

GROUP_LIMIT = 200  # groups shown, largest first; the page says when there are more
# A time window's groups are counted from its newest failures, at most this many: each is
# one probe into failure_members, so a wide window at 1M failures would take seconds.
WINDOW_SCAN = 10_000
SCOPES_SHOWN = 5  # scope names shown per group, most affected first

_c, _m, _s = failure_group_scopes.c, failure_members.c, failure_signatures.c
__all__ = ["FailureGroup", "FailureGroups", "count_group", "error_signature", "group_chunk",
           "group_id", "read_groups"]


@dataclass(slots=True, kw_only=True)
class FailureGroup:
    """Failures sharing an event type and an error signature."""

    id: str
    event_type: str = ""
    signature: str = ""
    count: int = 0
    first_seen: datetime | None = None  # when the first of them failed
    last_seen: datetime | None = None
    scope_count: int = 0  # how many scopes it affects
    scopes: list[str] = field(default_factory=list)  # the most affected, SCOPES_SHOWN at most
    example: str | None = None  # one full error, as stored
    state: str | None = None  # None, "acknowledged" or "muted"
    note: str | None = None
    updated_by: str | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureGroups:
    """The groups (largest first, muted ones apart) and what they were counted from."""

    groups: list[FailureGroup]
    muted: list[FailureGroup]
    total: int  # failures in the groups read
    windowed: bool  # counted from a time window's failures, not from the counters
    capped: bool  # windowed, and more failures matched than WINDOW_SCAN
    limited: bool  # more than GROUP_LIMIT groups: the largest are shown


def windowed(f: ReceiptFilter) -> bool:
    """Tell whether the filter has a time window (which the counters cannot answer)."""
    return f.since is not None or f.until is not None


def _scope_terms(column: Any, f: ReceiptFilter) -> list[ColumnElement[bool]]:
    """Return the filter's scope terms on a scope id column."""
    terms: list[ColumnElement[bool]] = []
    if f.scope_id is not None:
        terms.append(column == f.scope_id)
    if f.scope_ids is not None:
        terms.append(column.in_(f.scope_ids))
    return terms


def _counter_terms(f: ReceiptFilter) -> list[ColumnElement[bool]]:
    """Return the WHERE terms of the counters matching a filter without a time window."""
    terms = _scope_terms(_c.scope_id, f)
    if f.event_type:
        terms.append(_c.group_id.in_(select(_s.id).where(_s.event_type == f.event_type)))
    return terms


def groups_stmt(f: ReceiptFilter) -> Any:
    """Return the query of the largest groups' totals from the counters (GROUP_LIMIT + 1)."""
    total = func.sum(_c.count).label("failures")
    return (select(_c.group_id, total, func.min(_c.first_seen).label("first_seen"),
                   func.max(_c.last_seen).label("last_seen"),
                   func.count().label("scope_count"))
            .where(*_counter_terms(f)).group_by(_c.group_id)
            .order_by(total.desc(), _c.group_id).limit(GROUP_LIMIT + 1))


def _top_scopes(conn: Connection, f: ReceiptFilter, gids: list[str]) -> dict[str, list[int]]:
    """Return each group's most affected scope ids (SCOPES_SHOWN at most)."""
    if not gids:
        return {}
    rank = func.row_number().over(partition_by=_c.group_id,
                                  order_by=(_c.count.desc(), _c.scope_id)).label("rank")
    ranked = (select(_c.group_id, _c.scope_id, rank)
              .where(_c.group_id.in_(gids), *_scope_terms(_c.scope_id, f)).subquery())
    top: dict[str, list[int]] = {}
    for r in conn.execute(select(ranked.c.group_id, ranked.c.scope_id)
                          .where(ranked.c.rank <= SCOPES_SHOWN)
                          .order_by(ranked.c.group_id, ranked.c.rank)):
        top.setdefault(r.group_id, []).append(r.scope_id)
    return top


def _from_counters(conn: Connection, f: ReceiptFilter) -> tuple[list[FailureGroup], bool]:
    """Read the largest groups of every failure matching the filter from the counters."""
    rows = conn.execute(groups_stmt(f)).all()
    limited, rows = len(rows) > GROUP_LIMIT, rows[:GROUP_LIMIT]
    groups = [FailureGroup(id=r.group_id, count=int(r.failures), first_seen=r.first_seen,
                           last_seen=r.last_seen, scope_count=int(r.scope_count)) for r in rows]
    top = _top_scopes(conn, f, [g.id for g in groups])
    names = scope_names(conn, {s for ids in top.values() for s in ids})
    for g in groups:
        g.scopes = [names.get(s, (f"#{s}",))[0] for s in top.get(g.id, [])]
    return groups, limited


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


def _members_join() -> Any:
    """Return receipts joined to their failure group membership."""
    return receipts.join(failure_members, and_(_m.scope_id == receipts.c.scope_id,
                                               _m.event_id == receipts.c.event_id))


def window_stmt(conn: Connection, f: ReceiptFilter, limit: int) -> Any:
    """Return the per (group, scope) totals of the window's newest `limit` failures."""
    # The window's newest failures first, alone: newest first in the (state, accepted_at)
    # partial index's own order, read backwards, so the scan stops after `limit` rows;
    # only then each is joined to its stored group (a LIMITed subquery is not merged
    # into the join, so the planner cannot start from the million stored groups).
    newest = (select(receipts.c.scope_id, receipts.c.event_id).where(*_failed_terms(conn, f))
              .order_by(receipts.c.state.desc(), receipts.c.accepted_at.desc())
              .limit(limit).subquery())
    joined = (select(_m.group_id, _m.scope_id, _m.failed_at)
              .select_from(newest.join(failure_members, and_(
                  _m.scope_id == newest.c.scope_id, _m.event_id == newest.c.event_id)))
              .subquery())
    return (select(joined.c.group_id, joined.c.scope_id, func.count().label("failures"),
                   func.min(joined.c.failed_at).label("first_seen"),
                   func.max(joined.c.failed_at).label("last_seen"))
            .group_by(joined.c.group_id, joined.c.scope_id))


def _from_window(conn: Connection, f: ReceiptFilter, scan: int
                 ) -> tuple[list[FailureGroup], bool]:
    """Count the groups of the newest `scan` failures of a time window."""
    groups: dict[str, FailureGroup] = {}
    per_scope: dict[str, list[tuple[int, int]]] = {}
    if conn.dialect.name == "postgresql":
        # The window's failures are few next to every stored group: probe each by key.
        # Misjudging how few, the planner would hash all of failure_members instead
        # (at 1M receipts, 0.6 s for an hour's 6,000 failures).
        conn.exec_driver_sql("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off")
    for r in conn.execute(window_stmt(conn, f, scan)):
        g = groups.setdefault(r.group_id, FailureGroup(id=r.group_id))
        g.count += r.failures
        g.first_seen = min(filter(None, (g.first_seen, r.first_seen)))
        g.last_seen = max(filter(None, (g.last_seen, r.last_seen)))
        g.scope_count += 1
        per_scope.setdefault(r.group_id, []).append((-r.failures, r.scope_id))
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.id))
    shown = ordered[:GROUP_LIMIT]
    top = {g.id: [s for _, s in sorted(per_scope[g.id])[:SCOPES_SHOWN]] for g in shown}
    names = scope_names(conn, {s for ids in top.values() for s in ids})
    for g in shown:
        g.scopes = [names.get(s, (f"#{s}",))[0] for s in top[g.id]]
    return shown, len(ordered) > GROUP_LIMIT


def read_groups(conn: Connection, f: ReceiptFilter, *, scan: int = WINDOW_SCAN) -> FailureGroups:
    """Group the failures matching the filter: all of them, or a window's newest `scan`."""
    if windowed(f):
        groups, limited = _from_window(conn, f, scan + 1)
        total = sum(g.count for g in groups)
        capped, total = total > scan, min(total, scan)
    else:
        groups, limited = _from_counters(conn, f)
        total = int(conn.execute(select(func.coalesce(func.sum(_c.count), 0))
                                 .where(*_counter_terms(f))).scalar_one())
        capped = False
    _attach_text(conn, groups)
    _attach_state(conn, groups)
    return FailureGroups(groups=[g for g in groups if g.state != "muted"],
                         muted=[g for g in groups if g.state == "muted"], total=total,
                         windowed=windowed(f), capped=capped, limited=limited)


def _attach_text(conn: Connection, groups: list[FailureGroup]) -> None:
    """Copy each group's event type, signature and example onto it."""
    if not groups:
        return
    by_id = {g.id: g for g in groups}
    for row in conn.execute(select(_s.id, _s.event_type, _s.signature, _s.example)
                            .where(_s.id.in_(sorted(by_id)))):
        g = by_id[row.id]
        g.event_type, g.signature, g.example = row.event_type, row.signature, row.example


def _attach_state(conn: Connection, groups: list[FailureGroup]) -> None:
    """Copy each group's acknowledgement or mute onto it."""
    if not groups:
        return
    by_id = {g.id: g for g in groups}
    for row in conn.execute(select(failure_groups)
                            .where(failure_groups.c.id.in_(sorted(by_id)))):
        g = by_id[row.id]
        g.state, g.note = row.state, row.note
        g.updated_by, g.updated_at = row.updated_by, row.updated_at


def group_chunk_stmt(conn: Connection, f: ReceiptFilter, gid: str,
                     after: tuple[datetime, int, str] | None, size: int) -> Any:
    """Return the query of the group's next `size` members matching the filter."""
    terms: list[Any] = [_m.group_id == gid, *_scope_terms(_m.scope_id, f)]
    if after is not None:  # the keyset (scope, failed_at, event id) of the group's index
        at, scope_id, event_id = after
        terms += [_m.scope_id >= scope_id,
                  tuple_(_m.scope_id, _m.failed_at, _m.event_id) > tuple_(scope_id, at, event_id)]
    stmt = select(_m.failed_at, _m.scope_id, _m.event_id)
    if windowed(f):
        stmt = stmt.select_from(_members_join()).where(*_failed_terms(conn, f))
    return stmt.where(*terms).order_by(_m.scope_id, _m.failed_at, _m.event_id).limit(size)


def group_chunk(conn: Connection, f: ReceiptFilter, gid: str,
                after: tuple[datetime, int, str] | None, size: int
                ) -> tuple[list[tuple[datetime, int, str]], tuple[datetime, int, str] | None, int]:
    """Return the group's next `size` members matching the filter as (failed_at, scope id,
    event id), the last of them (None when none was left) and how many there were."""
    keys = [(r.failed_at, r.scope_id, r.event_id)
            for r in conn.execute(group_chunk_stmt(conn, f, gid, after, size))]
    return keys, (keys[-1] if keys else None), len(keys)


def count_group_stmt(f: ReceiptFilter, gid: str) -> Any:
    """Return the query of one group's failures matching a filter without a time window."""
    return (select(func.coalesce(func.sum(_c.count), 0))
            .where(_c.group_id == gid, *_scope_terms(_c.scope_id, f)))


def count_group(conn: Connection, f: ReceiptFilter, gid: str, *, cap: int) -> tuple[int, bool]:
    """Count the failures of one group matching the filter (a time window: up to `cap`)."""
    if not windowed(f):
        return int(conn.execute(count_group_stmt(f, gid)).scalar_one()), False
    inner = (select(_m.event_id).select_from(_members_join())
             .where(_m.group_id == gid, *_failed_terms(conn, f)).limit(cap + 1).subquery())
    count = int(conn.execute(select(func.count()).select_from(inner)).scalar_one())
    return min(count, cap), count > cap
