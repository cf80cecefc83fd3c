"""Acme's handlers: the module the `replay_ledger.handlers` entry point names."""

from __future__ import annotations

from typing import Any

from ledger.handlers import Event, PermanentFailure, handler
from sqlalchemy import Connection, insert, select

from acme_handlers.tables import acme_invoices


def _invoice(event: Event) -> tuple[str, int]:
    """Return (invoice id, amount in cents) from the body, or fail for good."""
    data: Any = event.payload.get("data")
    invoice = data.get("invoice") if isinstance(data, dict) else None
    amount = data.get("amount_cents") if isinstance(data, dict) else None
    if not isinstance(invoice, str) or not invoice:
        raise PermanentFailure("acme.invoice.paid needs a string data.invoice")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise PermanentFailure("acme.invoice.paid needs a non-negative integer data.amount_cents")
    return invoice, amount


@handler("acme.invoice.paid")
def record_paid_invoice(conn: Connection, event: Event) -> str:
    """Record the paid invoice; a second payment of one invoice is refused for good."""
    invoice, amount = _invoice(event)
    key = {"scope_id": event.scope_id, "invoice_id": invoice}
    paid_by = conn.execute(select(acme_invoices.c.paid_by_event).where(
        acme_invoices.c.scope_id == event.scope_id,
        acme_invoices.c.invoice_id == invoice)).scalar()
    if paid_by is not None:
        raise PermanentFailure(f"invoice {invoice} was already paid by another event")
    conn.execute(insert(acme_invoices).values(**key, amount_cents=amount,
                                              paid_by_event=event.idempotency_key))
    return f"acme-invoice:{invoice}"
