"""`ledger credential …`: signing credentials of an integration."""

from __future__ import annotations

from datetime import datetime

import click

from ledger.access import audit
from ledger.access.credentials import (
    DEFAULT_OVERLAP_SECONDS,
    MAX_OVERLAP_SECONDS,
    add_credential,
    list_credentials,
    revoke_credential,
    rotate_credential,
)
from ledger.access.integrations import get_integration
from ledger.cli import ledger_cli
from ledger.cli.common import (
    emit,
    handles_ledger_errors,
    json_option,
    read_stdin_secret,
    services,
)

LABEL_OPTION = click.option("--label", default=None,
                            help="A name for the key, shown in listings (at most 80 characters).")


def _iso(moment: datetime | None) -> str | None:
    """Return an ISO string or None."""
    return moment.isoformat() if moment is not None else None


@ledger_cli.group("credential")
def credential_group() -> None:
    """Signing credentials: add, rotate, revoke, list."""


@credential_group.command("add")
@click.option("--integration", "public_id", required=True, help="Integration id (in_…).")
@click.option("--secret-stdin", is_flag=True, help="Read the secret from stdin.")
@LABEL_OPTION
@json_option
@handles_ledger_errors
def credential_add(public_id: str, secret_stdin: bool, label: str | None,
                   as_json: bool) -> None:
    """Add an active credential; its secret is printed once."""
    secret = read_stdin_secret("secret") if secret_stdin else None
    svc = services()
    with svc.engine.begin() as conn:
        integration = get_integration(conn, public_id)
        credential = add_credential(conn, svc.box, audit.Actor.cli(), integration,
                                    now=svc.clock.now(), secret=secret, label=label)
    emit(as_json, {"key_id": credential.key_id, "secret": credential.shown_secret},
         text=f"key {credential.key_id} secret (shown once): {credential.shown_secret}")


@credential_group.command("list")
@click.option("--integration", "public_id", required=True, help="Integration id (in_…).")
@json_option
@handles_ledger_errors
def credential_list(public_id: str, as_json: bool) -> None:
    """List credentials with their states and fingerprints (never secrets)."""
    svc = services()
    with svc.engine.connect() as conn:
        integration = get_integration(conn, public_id)
        creds = list_credentials(conn, integration)
    rows = [{"key_id": c.key_id, "state": c.state.value, "created_at": _iso(c.created_at),
             "expires_at": _iso(c.expires_at), "revoked_at": _iso(c.revoked_at),
             "fingerprint": c.fingerprint} for c in creds]
    emit(as_json, {"credentials": rows},
         text="\n".join(f"{c.key_id}  {c.state.value:<8}  {c.fingerprint}  {c.label or ''}".rstrip()
                        for c in creds))


@credential_group.command("rotate")
@click.option("--integration", "public_id", required=True, help="Integration id (in_…).")
@click.option("--secret-stdin", is_flag=True, help="Read the replacement secret from stdin.")
@click.option("--overlap", "overlap", type=click.IntRange(0, MAX_OVERLAP_SECONDS),
              default=DEFAULT_OVERLAP_SECONDS, show_default=True,
              help="Seconds the old keys keep verifying (0 stops them now).")
@click.option("--reason", default=None, help="Why (kept in the audit log).")
@LABEL_OPTION
@json_option
@handles_ledger_errors
def credential_rotate(public_id: str, secret_stdin: bool, overlap: int, reason: str | None,
                      label: str | None, as_json: bool) -> None:
    """Add a replacement key on the same scope; the old live keys retire after the overlap."""
    secret = read_stdin_secret("secret") if secret_stdin else None
    svc = services()
    with svc.engine.begin() as conn:
        integration = get_integration(conn, public_id)
        rotation = rotate_credential(conn, svc.box, audit.Actor.cli(), integration,
                                     now=svc.clock.now(), overlap_seconds=overlap,
                                     secret=secret, reason=reason, label=label)
    retiring = "\n".join(f"retiring {k} until {at.isoformat()}" for k, at in rotation.retiring)
    emit(as_json, rotation.to_json(),
         text=f"key {rotation.key_id} secret (shown once): {rotation.secret}\n{retiring}".strip())


@credential_group.command("revoke")
@click.option("--key-id", "key_id", required=True, help="Credential id (key_…).")
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@json_option
@handles_ledger_errors
def credential_revoke(key_id: str, reason: str, as_json: bool) -> None:
    """Revoke a credential now; every instance refuses it within the propagation bound."""
    svc = services()
    with svc.engine.begin() as conn:
        credential = revoke_credential(conn, audit.Actor.cli(), key_id, reason=reason,
                                       now=svc.clock.now())
    bound = svc.settings.revocation_bound_seconds
    emit(as_json, {"key_id": credential.key_id, "state": credential.state.value,
                   "revoked_at": _iso(credential.revoked_at),
                   "propagation_bound_seconds": bound},
         text=f"revoked {credential.key_id}; every instance refuses it within {bound} s")
