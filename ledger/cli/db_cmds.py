"""`ledger db …`: schema migrations and the distributed (Citus) layout."""

from __future__ import annotations

import click

from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.db import citus
from ledger.db.engine import storage_guard, upgrade


@ledger_cli.group("db")
def db_group() -> None:
    """Database schema."""


@db_group.command("upgrade")
def db_upgrade() -> None:
    """Migrate DATABASE_URL to the newest schema (Alembic upgrade head)."""
    upgrade(services().engine)
    click.echo("database at head", err=True)


@db_group.command("distribute")
@json_option
@handles_ledger_errors
def db_distribute(as_json: bool) -> None:
    """Distribute the ledger by scope on Citus (idempotent); the rest become reference tables.

    Run on the coordinator after `ledger db upgrade`; restart the ledger's
    processes afterwards (each reads the layout once, at its first claim).
    """
    with storage_guard():
        done = citus.distribute(services().engine)
    emit(as_json, done, text=(
        f"distributed by scope_id: {', '.join(done['distributed']) or 'none new'}; "
        f"reference tables: {', '.join(done['reference']) or 'none new'}; "
        f"already laid out: {len(done['unchanged'])}"))
