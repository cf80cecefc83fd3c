"""Failure groups kept as failures happen: each terminal failure's signature, computed once.

A group is one event type and one error signature: the last error's class and its
message with the parts that vary from one event to the next (numbers, uuids, hex
digests, prefixed ids such as `evt_123`) replaced by placeholders, so "amount 7 too
big for acct_42" and "amount 9 too big for acct_43" are one group. A group's id is a
digest of (event type, signature): stable, it also keys the operator's
acknowledgement or mute (`failure_groups`, ledger.worker.failure_review).

When a receipt fails terminally, the transaction that fails it records the failure
here: its group in `failure_members` (one row per failed receipt), the group's text
in `failure_signatures`, and one more failure in the (group, scope) counter of
`failure_group_scopes` with its first and last failure time. A requeue and the
retention purge take the member out and subtract it in their own transactions, so
the counters are always the failures that are failed now, however many there are,
and the failures page reads counters instead of the failures themselves.

A receipt can still leave by another path (deleted by hand, a repair, a state
changed outside the worker); the scheduled sweep (jobs/sweep.py) walks the members
in key order, a bounded batch per run, takes out those whose receipt is gone or no
longer failed, and deletes the texts of groups left without a member, unless an
operator acknowledged or muted the group (its note is audited state and stays).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    delete,
    func,
    select,
    tuple_,
    update,
)

from ledger.db.engine import conflict_insert
from ledger.db.schema import (
    attempts,
    failure_group_scopes,
    failure_groups,
    failure_members,
    failure_signatures,
    receipts,
)
from ledger.domain import ReceiptState

SIGNATURE_LIMIT = 300
EXAMPLE_LIMIT = 500  # one full error kept per group, as its example
_REMOVE_CHUNK = 500
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


def record_failure(conn: Connection, *, scope_id: int, event_id: str, event_type: str,
                   error: str | None, failed_at: datetime) -> str:
    """Count a receipt that just failed terminally into its group; return the group's id."""
    signature = error_signature(error)
    gid = group_id(event_type, signature)
    # Looked up first: a group's text is written once, and on a distributed ledger
    # (Citus: a reference table) every write to it would commit on every node.
    known = conn.execute(select(failure_signatures.c.id)
                         .where(failure_signatures.c.id == gid)).first()
    if known is None:
        conn.execute(conflict_insert(conn, failure_signatures).values(
            id=gid, event_type=event_type, signature=signature,
            example=(error or "")[:EXAMPLE_LIMIT] or None, first_seen=failed_at)
            .on_conflict_do_nothing(index_elements=["id"]))
    added = conn.execute(conflict_insert(conn, failure_members).values(
        scope_id=scope_id, event_id=event_id, group_id=gid, failed_at=failed_at)
        .on_conflict_do_nothing(index_elements=["scope_id", "event_id"])
        .returning(failure_members.c.group_id)).first()
    if added is None:  # already counted (a member leaves only by requeue or purge)
        return gid
    counter = conflict_insert(conn, failure_group_scopes).values(
        group_id=gid, scope_id=scope_id, count=1, first_seen=failed_at, last_seen=failed_at)
    c, new = failure_group_scopes.c, counter.excluded
    conn.execute(counter.on_conflict_do_update(
        index_elements=["group_id", "scope_id"],
        set_={"count": c.count + 1,
              "first_seen": case((new.first_seen < c.first_seen, new.first_seen),
                                 else_=c.first_seen),
              "last_seen": case((new.last_seen > c.last_seen, new.last_seen),
                                else_=c.last_seen)}))
    return gid


def remove_failure(conn: Connection, scope_id: int, event_id: str) -> None:
    """Take one receipt out of its failure group (it was requeued)."""
    removed = conn.execute(
        delete(failure_members)
        .where(failure_members.c.scope_id == scope_id, failure_members.c.event_id == event_id)
        .returning(failure_members.c.group_id, failure_members.c.scope_id)).all()
    forget_members(conn, [(r.group_id, r.scope_id) for r in removed])


def remove_failures(conn: Connection, keys: Sequence[tuple[int, str]]) -> None:
    """Take receipts out of their failure groups by (scope id, event id) (they were purged)."""
    removed: list[tuple[str, int]] = []
    m = failure_members.c
    for start in range(0, len(keys), _REMOVE_CHUNK):
        chunk = list(keys[start:start + _REMOVE_CHUNK])
        removed += [(r.group_id, r.scope_id) for r in conn.execute(
            delete(failure_members).where(tuple_(m.scope_id, m.event_id).in_(chunk))
            .returning(m.group_id, m.scope_id))]
    forget_members(conn, removed)


_m, _c = failure_members.c, failure_group_scopes.c
_pair = (_m.group_id == bindparam("gid"), _m.scope_id == bindparam("sid"))
# After members left: subtract them and re-read the pair's first and last failure from
# the members' index (two probes); a pair with no member left is deleted below.
_SHRINK = (
    update(failure_group_scopes)
    .where(_c.group_id == bindparam("gid"), _c.scope_id == bindparam("sid"))
    .values(count=_c.count - bindparam("n"),
            first_seen=func.coalesce(select(func.min(_m.failed_at)).where(*_pair)
                                     .scalar_subquery(), _c.first_seen),
            last_seen=func.coalesce(select(func.max(_m.failed_at)).where(*_pair)
                                    .scalar_subquery(), _c.last_seen))
)


def forget_members(conn: Connection, removed: Iterable[tuple[str, int]]) -> None:
    """Subtract removed members, one (group id, scope id) per member, from the counters."""
    counts = Counter(removed)
    if not counts:
        return
    # One statement per pair, in a fixed order so concurrent removers lock pairs alike.
    conn.execute(_SHRINK, [{"gid": gid, "sid": sid, "n": n}
                           for (gid, sid), n in sorted(counts.items())])
    conn.execute(delete(failure_group_scopes).where(
        _c.count <= 0, _c.group_id.in_(sorted({gid for gid, _ in counts})),
        _c.scope_id.in_(sorted({sid for _, sid in counts}))))


def rebuild_counters(conn: Connection) -> None:
    """Recount every (group, scope) counter from the members (after a bulk load or backfill)."""
    conn.execute(delete(failure_group_scopes))
    conn.execute(failure_group_scopes.insert().from_select(
        ["group_id", "scope_id", "count", "first_seen", "last_seen"],
        select(_m.group_id, _m.scope_id, func.count(), func.min(_m.failed_at),
               func.max(_m.failed_at)).group_by(_m.group_id, _m.scope_id)))



_r, _s = receipts.c, failure_signatures.c
_FAILED = ReceiptState.FAILED.code
# The member's receipt is still there and still failed (correlated to the member row).
_still_failed = (select(_r.scope_id).where(_r.scope_id == _m.scope_id,
                                           _r.event_id == _m.event_id, _r.state == _FAILED)
                 .exists())
_reviewed = select(failure_groups.c.id).where(failure_groups.c.id == _s.id).exists()


def sweep_members(conn: Connection, after: tuple[int, str] | None, limit: int
                  ) -> tuple[tuple[int, str] | None, int]:
    """Check the next `limit` members after `after` (key order); return where to go on
    (None: the end was reached) and how many left their group.

    A member whose receipt is gone or no longer failed leaves its group (its counter
    shrinks); a failed one whose group lost its text gets it back from the receipt.
    """
    stmt = (select(_m.scope_id, _m.event_id, _m.group_id, _m.failed_at, _r.state,
                   _r.event_type, _s.id.label("text_id"))
            .select_from(failure_members
                         .outerjoin(receipts, and_(_r.scope_id == _m.scope_id,
                                                   _r.event_id == _m.event_id))
                         .outerjoin(failure_signatures, _s.id == _m.group_id))
            .order_by(_m.scope_id, _m.event_id).limit(limit))
    if after is not None:
        stmt = stmt.where(tuple_(_m.scope_id, _m.event_id) > tuple_(*after))
    rows = conn.execute(stmt).all()
    removed: list[tuple[str, int]] = []
    stale = [(r.scope_id, r.event_id) for r in rows if r.state != _FAILED]
    for start in range(0, len(stale), _REMOVE_CHUNK):
        # Rechecked in the DELETE: a receipt failed again since the read stays counted.
        removed += [(r.group_id, r.scope_id) for r in conn.execute(
            delete(failure_members)
            .where(tuple_(_m.scope_id, _m.event_id).in_(stale[start:start + _REMOVE_CHUNK]),
                   ~_still_failed)
            .returning(_m.group_id, _m.scope_id))]
    forget_members(conn, removed)
    for row in rows:
        if row.state == _FAILED and row.text_id is None:
            _restore_text(conn, row)
    last = (rows[-1].scope_id, rows[-1].event_id) if len(rows) == limit else None
    return last, len(removed)


def _restore_text(conn: Connection, member: Any) -> None:
    """Write a group's text again from a member's last error (if it still names that group).

    The signature sweep below may delete a group's text at the moment a worker, having
    found it, counts a new member: this puts it back on the members' next pass.
    """
    error = conn.execute(
        select(attempts.c.error)
        .where(attempts.c.scope_id == member.scope_id, attempts.c.event_id == member.event_id,
               attempts.c.error.is_not(None))
        .order_by(attempts.c.number.desc(), attempts.c.id.desc()).limit(1)).scalar()
    signature = error_signature(error)
    if group_id(member.event_type, signature) != member.group_id:
        return
    conn.execute(conflict_insert(conn, failure_signatures).values(
        id=member.group_id, event_type=member.event_type, signature=signature,
        example=(error or "")[:EXAMPLE_LIMIT] or None, first_seen=member.failed_at)
        .on_conflict_do_nothing(index_elements=["id"]))


def sweep_signatures(conn: Connection, after: str | None, limit: int
                     ) -> tuple[str | None, int]:
    """Check the next `limit` group texts after `after`; delete those with no member left
    whose group no operator acknowledged or muted. Return where to go on and how many went."""
    stmt = select(_s.id).order_by(_s.id).limit(limit)
    if after is not None:
        stmt = stmt.where(_s.id > after)
    ids = list(conn.execute(stmt).scalars())
    # A plain IN list, no subquery correlated to the texts: on Citus the texts are a
    # reference table and the members are distributed, and such a subquery is refused.
    # A worker that counts a new member of a group between this read and the DELETE
    # leaves it without its text until the members' pass restores it (_restore_text).
    used = _in_use(conn, ids)
    orphans = [i for i in ids if i not in used]
    gone = 0
    if orphans:
        gone = conn.execute(delete(failure_signatures)
                            .where(_s.id.in_(orphans), ~_reviewed)).rowcount
    return (ids[-1] if len(ids) == limit else None), gone


def _in_use(conn: Connection, ids: list[str]) -> set[str]:
    """Return which of the group ids have a member."""
    if not ids:
        return set()
    return set(conn.execute(select(_m.group_id).where(_m.group_id.in_(ids)).distinct())
               .scalars())
