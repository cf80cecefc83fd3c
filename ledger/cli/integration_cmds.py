"""`ledger integration …`: connect a sender to an account."""

from __future__ import annotations

import click

from ledger.access import audit
from ledger.access.integrations import create_integration
from ledger.cli import ledger_cli
from ledger.cli.common import (
    emit,
    handles_ledger_errors,
    json_option,
    read_stdin_secret,
    services,
)
from ledger.intake.signatures import PROFILES


@ledger_cli.group("integration")
def integration_group() -> None:
    """Integrations: one sender connected to one account."""


@integration_group.command("create")
@click.option("--account", required=True, help="Account slug.")
@click.option("--name", required=True, help="Integration slug, unique within the account.")
@click.option("--profile", required=True, type=click.Choice(sorted(PROFILES)))
@click.option("--tolerance", type=int, default=300, show_default=True,
              help="Freshness window in seconds.")
@click.option("--max-body-bytes", type=int, default=None, help="Override the body limit.")
@click.option("--secret-stdin", is_flag=True, help="Read the first secret from stdin.")
@json_option
@handles_ledger_errors
def integration_create(account: str, name: str, profile: str, tolerance: int,
                       max_body_bytes: int | None, secret_stdin: bool, as_json: bool) -> None:
    """Create an integration and its first credential; the secret is printed once."""
    secret = read_stdin_secret("secret") if secret_stdin else None
    svc = services()
    with svc.engine.begin() as conn:
        integration, credential = create_integration(
            conn, svc.box, audit.Actor.cli(), account=account, name=name, profile=profile,
            now=svc.clock.now(), tolerance=tolerance, max_body_bytes=max_body_bytes,
            secret=secret)
    emit(as_json, {
        "integration": integration.public_id, "scope": integration.scope,
        "profile": integration.profile,
        "credential": {"key_id": credential.key_id, "secret": credential.secret},
    }, text=(f"integration {integration.public_id} scope {integration.scope}\n"
             f"POST /hooks/{integration.public_id}\n"
             f"key {credential.key_id} secret (shown once): {credential.secret}"))
