"""Reading receipts for operators (CLI, API, dashboard)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, select

from ledger.access import audit
from ledger.access.integrations import get_integration_by_scope
from ledger.db.schema import attempts, receipts
from ledger.domain import JobStatus, Receipt, ReceiptState
from ledger.errors import NotFound, Refused
from ledger.logs import event_ref, get_logger
from ledger.worker.store import lock_job, requeue_job

log = get_logger("ledger.receipts")


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


def requeue_receipt(conn: Connection, actor: audit.Actor, *, scope: str, event_id: str,
                    reason: str, now: datetime, review_window_seconds: int | None = None
                    ) -> None:
    """Queue a failed receipt's job again, due now; audited. History is kept, never erased.

    The requeued job gets a fresh retry budget (attempt count and age window
    start again) while the receipt's attempt total and its `attempts` rows keep
    growing. Refused when the receipt is not failed or its payload is gone.
    """
    if not reason or not reason.strip():
        raise Refused("a reason is required to requeue a receipt")
    audit.check_reason(reason.strip())
    integration = get_integration_by_scope(conn, scope)
    job = lock_job(conn, integration.id, event_id)  # jobs first: the worker's lock order
    receipt = get_receipt(conn, scope, event_id)
    if receipt.state is not ReceiptState.FAILED:
        raise Refused(f"only failed receipts can be requeued; {scope}:{event_id} is "
                      f"{receipt.state.value}")
    if job is None or job.payload is None or job.status != JobStatus.FAILED.value or (
        review_window_seconds is not None
        and job.window_start < now - timedelta(seconds=review_window_seconds)
    ):
        raise Refused(f"the payload of {scope}:{event_id} was dropped at the end of its "
                      "review window; it cannot be requeued (ask the sender to redeliver "
                      "under a new event id)")
    requeue_job(conn, integration.id, event_id, now)
    audit.record(conn, actor, "receipt.requeue", f"{scope}:{event_id}", at=now, scope=scope,
                 reason=reason.strip(), detail={"attempts_before": receipt.attempts})
    log.info("job.transition", scope=scope, event_ref=event_ref(scope, event_id),
             event_type=receipt.event_type, attempt=receipt.attempts, from_state="failed",
             to_state="pending", actor=actor.name)
