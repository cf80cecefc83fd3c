"""`ledger demo …`: the demo ledger and its balances."""

from __future__ import annotations

import click
from flask import current_app

from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.demo import balance, seed
from ledger.integrations import get_integration_by_scope


@ledger_cli.group("demo")
def demo_group() -> None:
    """The demo ledger used by `make run`."""


@demo_group.command("seed")
def demo_seed() -> None:
    """Create demo accounts and send signed deliveries (a duplicate and a conflict included)."""
    sent = seed(current_app._get_current_object())  # type: ignore[attr-defined]
    if not sent:
        click.echo("demo already seeded")
    for delivery in sent:
        click.echo(f"{delivery.scope:<22} {delivery.event_id:<8} {delivery.status} "
                   f"{delivery.answer.get('status') or delivery.answer.get('error')}")


@demo_group.command("balance")
@click.option("--scope", required=True, help="Consumer scope, account/integration.")
@json_option
@handles_ledger_errors
def demo_balance(scope: str, as_json: bool) -> None:
    """Show a scope's demo balance."""
    svc = services()
    with svc.engine.connect() as conn:
        integration = get_integration_by_scope(conn, scope)
        value = balance(conn, integration.id)
    emit(as_json, {"scope": integration.scope, "balance": value},
         text=f"{integration.scope}: {value}")
