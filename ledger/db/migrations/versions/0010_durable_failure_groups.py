"""Failure groups become durable: each failure's group is stored once, counted per scope.

Revision ID: 0010_durable_failure_groups
Revises: 0009_scope_totals
Create Date: 2026-12-01

Backfill: every receipt that is failed now gets its group from its last error,
with the normaliser the worker used when this revision was written (copied below from
ledger.worker.failure_groups: a migration never imports live code, which may change
after it), read and written BACKFILL_BATCH receipts at a time; the counters are then
one GROUP BY. A group id that later code computes differently is corrected by the sweep.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import sqlalchemy as sa
from alembic import op

from ledger.db.schema import UTCDateTime

revision = "0010_durable_failure_groups"
down_revision = "0009_scope_totals"
branch_labels = None
depends_on = None

BACKFILL_BATCH = 5000
FAILED = 2  # ReceiptState.FAILED.code, as stored
# ledger.worker.failure_groups as of this revision.
SIGNATURE_LIMIT = 300
EXAMPLE_LIMIT = 500
_CLASS = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)(?::\s*|$)")
_VARYING = (  # most specific first: a uuid holds hex runs and numbers
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                r"[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"\b[A-Za-z]{1,12}_(?=[A-Za-z0-9]*\d)[A-Za-z0-9]+\b"), "<id>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "<n>"),
)


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


def group_id(event_type: str, signature: str) -> str:
    """Return the stable id of the group of (event type, signature)."""
    return hashlib.sha256(f"{event_type}\x00{signature}".encode()).hexdigest()[:16]

_FAILED_PAGE = sa.text("""
SELECT r.scope_id, r.event_id, r.event_type,
       COALESCE(r.completed_at, r.accepted_at) AS failed_at,
       (SELECT a.error FROM attempts a
        WHERE a.scope_id = r.scope_id AND a.event_id = r.event_id AND a.error IS NOT NULL
        ORDER BY a.number DESC, a.id DESC LIMIT 1) AS last_error
FROM receipts r
WHERE r.state = :failed
  AND (r.scope_id > :sid OR (r.scope_id = :sid AND r.event_id > :eid))
ORDER BY r.scope_id, r.event_id
LIMIT :batch
""").columns(failed_at=UTCDateTime)


def upgrade() -> None:
    """Create the members, signatures and per-scope counters, then backfill them."""
    op.create_table(
        "failure_members",
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("failed_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "event_id", name="pk_failure_members"),
    )
    op.create_index("ix_failure_members_group", "failure_members",
                    ["group_id", "scope_id", "failed_at", "event_id"])
    op.create_table(
        "failure_signatures",
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("example", sa.Text),
        sa.Column("first_seen", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_failure_signatures"),
    )
    op.create_table(
        "failure_group_scopes",
        sa.Column("group_id", sa.Text, nullable=False),
        sa.Column("scope_id", sa.Integer, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("first_seen", UTCDateTime, nullable=False),
        sa.Column("last_seen", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("group_id", "scope_id", name="pk_failure_group_scopes"),
    )
    op.create_index("ix_failure_group_scopes_scope", "failure_group_scopes", ["scope_id"])
    _backfill(op.get_bind())


def _backfill(conn: Any) -> None:
    """Store the group of every receipt failed now, then count the groups per scope."""
    members = sa.table("failure_members", sa.column("scope_id"), sa.column("event_id"),
                       sa.column("group_id"), sa.column("failed_at", UTCDateTime))
    signatures = sa.table("failure_signatures", sa.column("id"), sa.column("event_type"),
                          sa.column("signature"), sa.column("example"),
                          sa.column("first_seen", UTCDateTime))
    seen: dict[str, dict[str, Any]] = {}
    after: tuple[int, str] = (-1, "")
    while True:
        rows = conn.execute(_FAILED_PAGE, {"failed": FAILED, "sid": after[0], "eid": after[1],
                                           "batch": BACKFILL_BATCH}).all()
        if not rows:
            break
        batch = []
        for r in rows:
            signature = error_signature(r.last_error)
            gid = group_id(r.event_type, signature)
            batch.append({"scope_id": r.scope_id, "event_id": r.event_id, "group_id": gid,
                          "failed_at": r.failed_at})
            known = seen.setdefault(gid, {
                "id": gid, "event_type": r.event_type, "signature": signature,
                "example": (r.last_error or "")[:EXAMPLE_LIMIT] or None,
                "first_seen": r.failed_at})
            known["first_seen"] = min(known["first_seen"], r.failed_at)
        conn.execute(members.insert(), batch)
        after = (rows[-1].scope_id, rows[-1].event_id)
    if seen:
        conn.execute(signatures.insert(), list(seen.values()))
    conn.execute(sa.text(
        "INSERT INTO failure_group_scopes (group_id, scope_id, count, first_seen, last_seen) "
        "SELECT group_id, scope_id, count(*), min(failed_at), max(failed_at) "
        "FROM failure_members GROUP BY group_id, scope_id"))


def downgrade() -> None:
    """Drop the durable failure groups (the operators' verdicts in failure_groups stay)."""
    op.drop_index("ix_failure_group_scopes_scope", table_name="failure_group_scopes")
    op.drop_table("failure_group_scopes")
    op.drop_table("failure_signatures")
    op.drop_index("ix_failure_members_group", table_name="failure_members")
    op.drop_table("failure_members")
