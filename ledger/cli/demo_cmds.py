"""`ledger demo …`: the demo ledger and its balances."""

from __future__ import annotations

from typing import Any

import click

from ledger.access.integrations import get_integration_by_scope
from ledger.cli import ledger_cli
from ledger.cli.common import current_flask_app, emit, handles_ledger_errors, json_option, services
from ledger.demo.history import seed_admin
from ledger.demo.seed import balance, seed


@ledger_cli.group("demo")
def demo_group() -> None:
    """The demo ledger used by `make run`."""


@demo_group.command("seed")
def demo_seed() -> None:
    """Create demo accounts and send signed deliveries (a duplicate and a conflict included)."""
    password = seed_demo()
    if password:
        click.echo(password_line(password))


def seed_demo(*, serving: bool = False) -> str | None:
    """Seed the demo (printing each delivery); return the new admin password, if one was made.

    `serving`: `ledger dev` seeds in the process that serves, whose web instance must stay
    registered (revocation propagation is checked against it).
    """
    client = current_flask_app().test_client()

    def post(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        response = client.post(path, data=body, headers=headers)
        return response.status_code, response.get_json()

    sent = seed(services(serving=serving), post)
    if not sent:
        click.echo("demo already seeded")
    for delivery in sent:
        click.echo(f"{delivery.scope:<22} {delivery.event_id:<8} {delivery.status} "
                   f"{delivery.answer.get('status') or delivery.answer.get('error')}")
    return _seed_dashboard(serving=serving)


def password_line(password: str) -> str:
    """Return the line that tells the demo admin's password (shown once)."""
    return (f"dashboard: log in as admin with password {password} (shown once; "
            "set LEDGER_DEMO_ADMIN_PASSWORD to choose it)")


def _seed_dashboard(*, serving: bool = False) -> str | None:
    """Create the dashboard's demo admin and compute the rollups; return a new password."""
    svc = services(serving=serving)
    with svc.engine.begin() as conn:
        password = seed_admin(conn, svc.clock.now(), svc.settings.demo_admin_password)
    try:
        from ledger.jobs.rollups import refresh

        refresh(svc.engine, svc.clock, full_series=True)
    except ImportError:
        pass  # the scheduler computes them on its first run
    return password


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
