"""Acme's handler, run the way the ledger's worker runs it (ledger.testing)."""

from __future__ import annotations

from ledger.testing import LedgerDatabase, run_handler
from sqlalchemy import inspect, select

from acme_handlers.handlers import record_paid_invoice
from acme_handlers.tables import acme_invoices


def _paid(db: LedgerDatabase) -> list[tuple[str, int, str]]:
    with db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(  # type: ignore[misc]
            select(acme_invoices.c.invoice_id, acme_invoices.c.amount_cents,
                   acme_invoices.c.paid_by_event))]


def test_a_paid_invoice_is_recorded_once(db: LedgerDatabase) -> None:
    run = run_handler(db, record_paid_invoice, scope="acme/billing", event_id="evt_1",
                      payload={"data": {"invoice": "in_7", "amount_cents": 1250}})
    assert run.result_ref == "acme-invoice:in_7"
    assert _paid(db) == [("in_7", 1250, "acme/billing:evt_1")]


def test_a_second_payment_fails_for_good_and_writes_nothing(db: LedgerDatabase) -> None:
    payload = {"data": {"invoice": "in_8", "amount_cents": 100}}
    assert run_handler(db, "acme.invoice.paid", payload=payload, event_id="evt_a").completed
    again = run_handler(db, "acme.invoice.paid", payload=payload, event_id="evt_b")
    assert again.failure is not None and "already paid" in again.failure.reason
    assert [invoice for invoice, _, _ in _paid(db)] == ["in_8"]


def test_a_malformed_body_is_never_retried(db: LedgerDatabase) -> None:
    run = run_handler(db, record_paid_invoice, payload={"data": {"invoice": "in_9"}})
    assert run.failure is not None and "amount_cents" in run.failure.reason
    assert _paid(db) == []


def test_acme_migrations_live_beside_the_ledgers(db: LedgerDatabase) -> None:
    tables = set(inspect(db.engine).get_table_names())
    assert {"acme_invoices", "acme_alembic_version", "receipts", "alembic_version"} <= tables
