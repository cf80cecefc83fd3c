"""Acme's own table, beside the ledger's (created by acme_handlers' own migrations)."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, Table, Text

metadata = MetaData()

# One row per paid invoice. The handler writes it in the ledger's completion
# transaction, so it exists exactly when the receipt is complete.
acme_invoices = Table(
    "acme_invoices",
    metadata,
    Column("scope_id", Integer, primary_key=True),
    Column("invoice_id", Text, primary_key=True),
    Column("amount_cents", Integer, nullable=False),
    Column("paid_by_event", Text, nullable=False),  # the event's idempotency key
)
