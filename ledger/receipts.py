"""Reading receipts for operators (CLI, API, dashboard)."""

from __future__ import annotations

from sqlalchemy import Connection, select

from ledger.domain import Receipt, ReceiptState
from ledger.errors import NotFound
from ledger.integrations import get_integration_by_scope
from ledger.schema import attempts, receipts


def get_receipt(conn: Connection, scope: str, event_id: str) -> Receipt:
    """Return the receipt of (scope, event id) with its last error, or raise NotFound."""
    integration = get_integration_by_scope(conn, scope)
    row = conn.execute(
        select(receipts).where(receipts.c.scope_id == integration.id,
                               receipts.c.event_id == event_id)
    ).first()
    if row is None:
        raise NotFound("receipt", f"{scope}:{event_id}")
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
