"""A bulk requeue's follow-through: what became of the receipts it requeued.

The bulk requeue (ledger/web/dashboard/actions.py) notes each receipt it requeued under
its batch id; here their receipts are counted by state (a primary-key probe each, at
most COUNT_CAP of them): complete, pending (waiting or running), failed again.
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import Connection, func, insert, select

from ledger.db.schema import receipts, requeue_members
from ledger.domain import ReceiptState

BATCH_ID = re.compile(r"[0-9a-f]{16}")
COUNT_CAP = 100_000


def note_requeued(conn: Connection, batch_id: str, scope_id: int, event_id: str,
                  now: datetime) -> None:
    """Note one receipt requeued by a bulk requeue."""
    conn.execute(insert(requeue_members).values(batch_id=batch_id, scope_id=scope_id,
                                                event_id=event_id, requeued_at=now))


def batch_outcomes(conn: Connection, batch_id: str) -> dict[str, int]:
    """Return {state: count} of a batch's receipts now (expired ones under "expired")."""
    members = (select(requeue_members.c.scope_id, requeue_members.c.event_id)
               .where(requeue_members.c.batch_id == batch_id).limit(COUNT_CAP).subquery())
    rows = conn.execute(
        select(receipts.c.state, func.count())
        .select_from(members.outerjoin(receipts, (receipts.c.scope_id == members.c.scope_id)
                                       & (receipts.c.event_id == members.c.event_id)))
        .group_by(receipts.c.state)).all()
    counts = {state.value: 0 for state in ReceiptState}
    counts["expired"] = 0
    for state, n in rows:
        counts["expired" if state is None else ReceiptState.from_code(state).value] += int(n)
    return counts
