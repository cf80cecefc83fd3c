"""`ledger secrets …`: the master key that encrypts stored signing secrets."""

from __future__ import annotations

from ledger.access import audit
from ledger.access.credentials import rekey_secrets
from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.destinations.secrets import rekey_destination_secrets


@ledger_cli.group("secrets")
def secrets_group() -> None:
    """Stored signing secrets (encrypted at rest under LEDGER_MASTER_KEY)."""


@secrets_group.command("rekey")
@json_option
@handles_ledger_errors
def secrets_rekey(as_json: bool) -> None:
    """Re-encrypt every stored secret under the newest master key (first in the list)."""
    svc = services()
    with svc.engine.begin() as conn:
        count = rekey_secrets(conn, svc.box) + rekey_destination_secrets(conn, svc.box)
        audit.record(conn, audit.Actor.cli(), "secrets.rekey", "credentials",
                     at=svc.clock.now(), detail={"reencrypted": count})
    emit(as_json, {"reencrypted": count},
         text=f"re-encrypted {count} secrets under the newest master key")
