"""`ledger operator …`: dashboard accounts and their API tokens."""

from __future__ import annotations

import secrets
from datetime import datetime

import click

from ledger.access import audit
from ledger.access.operators import (
    DEFAULT_TOKEN_SECONDS,
    MAX_TOKEN_SECONDS,
    MIN_TOKEN_SECONDS,
    ROLES,
    create_operator,
    issue_token,
    list_operators,
    list_tokens,
    revoke_token,
)
from ledger.cli import ledger_cli
from ledger.cli.common import (
    emit,
    handles_ledger_errors,
    json_option,
    read_stdin_secret,
    services,
)


@ledger_cli.group("operator")
def operator_group() -> None:
    """Dashboard operators: accounts, roles and API tokens."""


@operator_group.command("create")
@click.option("--username", required=True)
@click.option("--role", required=True, type=click.Choice(ROLES))
@click.option("--password-stdin", is_flag=True,
              help="Read the password from stdin; otherwise one is generated and shown once.")
@json_option
@handles_ledger_errors
def operator_create(username: str, role: str, password_stdin: bool, as_json: bool) -> None:
    """Create an operator (argon2-hashed password); audited."""
    generated = not password_stdin
    password = read_stdin_secret("password") if password_stdin else secrets.token_urlsafe(18)
    svc = services()
    with svc.engine.begin() as conn:
        create_operator(conn, audit.Actor.cli(), username=username, role=role,
                        password=password, now=svc.clock.now())
    payload: dict[str, str] = {"username": username, "role": role}
    text = f"operator {username} ({role}) created"
    if generated:
        payload["password"] = password
        text += f"; password (shown once): {password}"
    emit(as_json, payload, text=text)


@operator_group.command("token")
@click.option("--username", required=True)
@click.option("--write", is_flag=True, help="Also allow requests that change things.")
@click.option("--expires-in", type=click.IntRange(MIN_TOKEN_SECONDS, MAX_TOKEN_SECONDS),
              default=DEFAULT_TOKEN_SECONDS, show_default=True, help="Lifetime in seconds.")
@json_option
@handles_ledger_errors
def operator_token(username: str, write: bool, expires_in: int, as_json: bool) -> None:
    """Issue an API token for /api/v1 (shown once; read-only unless --write); audited."""
    svc = services()
    with svc.engine.begin() as conn:
        issued = issue_token(conn, audit.Actor.cli(), username, now=svc.clock.now(),
                             write=write, expires_in=expires_in)
    emit(as_json, {"username": username, "token": issued.token, "token_id": issued.token_id,
                   "scopes": list(issued.scopes), "expires_at": issued.expires_at.isoformat()},
         text=f"API token {issued.token_id} for {username} ({' '.join(issued.scopes)}, "
              f"expires {issued.expires_at.isoformat()}; shown once): {issued.token}")


@operator_group.command("tokens")
@click.option("--username", required=True)
@json_option
@handles_ledger_errors
def operator_tokens(username: str, as_json: bool) -> None:
    """List an operator's API tokens, newest first (never a token itself)."""
    svc = services()
    with svc.engine.connect() as conn:
        rows = list_tokens(conn, username)
    fields = ("token_id", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at")
    items = [{k: (r[k].isoformat() if isinstance(r[k], datetime) else r[k]) for k in fields}
             for r in rows]
    emit(as_json, {"tokens": items},
         text="\n".join(f"{i['token_id']}  {' '.join(i['scopes']):<10} expires "
                        f"{i['expires_at']}  last used {i['last_used_at'] or '-'}"
                        f"{'  revoked ' + i['revoked_at'] if i['revoked_at'] else ''}"
                        for i in items) or "no tokens")


@operator_group.command("token-revoke")
@click.option("--token-id", required=True)
@json_option
@handles_ledger_errors
def operator_token_revoke(token_id: str, as_json: bool) -> None:
    """Revoke one API token by its id: it answers 401 from then on; audited."""
    svc = services()
    with svc.engine.begin() as conn:
        revoked_at = revoke_token(conn, audit.Actor.cli(), token_id, now=svc.clock.now())
    emit(as_json, {"token_id": token_id, "revoked_at": revoked_at.isoformat()},
         text=f"token {token_id} revoked at {revoked_at.isoformat()}")


@operator_group.command("list")
@json_option
def operator_list(as_json: bool) -> None:
    """List operators and their roles."""
    svc = services()
    with svc.engine.connect() as conn:
        rows = list_operators(conn)
    items = [{"username": r["username"], "role": r["role"],
              "disabled": r["disabled_at"] is not None} for r in rows]
    emit(as_json, {"operators": items},
         text="\n".join(f"{i['username']:<24} {i['role']:<9} "
                        f"{'disabled' if i['disabled'] else ''}" for i in items))
