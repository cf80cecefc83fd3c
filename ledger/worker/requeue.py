"""Putting a failed receipt back to work (operators, from the CLI and the dashboard)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection

from ledger.access import audit
from ledger.access.integrations import get_integration_by_scope
from ledger.domain import JobStatus, ReceiptState
from ledger.errors import Refused
from ledger.logs import event_ref, get_logger
from ledger.reads.receipts import get_receipt
from ledger.worker.store import lock_job, requeue_job

log = get_logger("ledger.receipts")


def requeue_receipt(conn: Connection, actor: audit.Actor, *, scope: str, event_id: str,
                    reason: str, now: datetime, review_window_seconds: float | None = None
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
