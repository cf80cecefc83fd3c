"""`ledger receipt …`: inspect receipts."""

from __future__ import annotations

import click

from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.receipts import get_receipt


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
