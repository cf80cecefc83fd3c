"""`ledger db …`: schema migrations."""

from __future__ import annotations

import click

from ledger.cli import ledger_cli
from ledger.cli.common import services
from ledger.db.engine import upgrade


@ledger_cli.group("db")
def db_group() -> None:
    """Database schema."""


@db_group.command("upgrade")
def db_upgrade() -> None:
    """Migrate DATABASE_URL to the newest schema (Alembic upgrade head)."""
    upgrade(services().engine)
    click.echo("database at head", err=True)
