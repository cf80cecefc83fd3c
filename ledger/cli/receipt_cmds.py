"""`ledger receipt …`: inspect receipts."""

from __future__ import annotations

import click

from ledger.access import audit
from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.reads.receipts import get_receipt


@ledger_cli.group("receipt")
def receipt_group() -> None:
    """Receipts: one per (scope, event id)."""


@receipt_group.command("show")
@click.option("--scope", required=True, help="Consumer scope, account/integration.")
@click.option("--event-id", required=True)
@json_option
@handles_ledger_errors
def receipt_show(scope: str, event_id: str, as_json: bool) -> None:
    """Show one receipt."""
    svc = services()
    with svc.engine.connect() as conn:
        receipt = get_receipt(conn, scope, event_id)
    data = receipt.to_json()
    emit(as_json, data, text="\n".join(f"{k:>13}: {v}" for k, v in data.items()))


@receipt_group.command("requeue")
@click.option("--scope", required=True, help="Consumer scope, account/integration.")
@click.option("--event-id", required=True)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@json_option
@handles_ledger_errors
def receipt_requeue(scope: str, event_id: str, reason: str, as_json: bool) -> None:
    """Queue a failed receipt again (its attempt history is kept)."""
    from ledger.worker.requeue import requeue_receipt  # `receipt show` starts without it

    svc = services()
    with svc.engine.begin() as conn:
        requeue_receipt(conn, audit.Actor.cli(), scope=scope, event_id=event_id,
                        reason=reason, now=svc.clock.now(),
                        review_window_seconds=svc.settings.review_window_seconds)
    emit(as_json, {"scope": scope, "event_id": event_id, "state": "pending"},
         text=f"{scope}:{event_id} requeued (pending)")
