"""`ledger operator …`: dashboard accounts and their API tokens."""

from __future__ import annotations

import secrets

import click

from ledger.access import audit
from ledger.access.operators import ROLES, create_operator, issue_token, list_operators
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
@json_option
@handles_ledger_errors
def operator_token(username: str, as_json: bool) -> None:
    """Issue an API token for /api/v1 (shown once); audited."""
    svc = services()
    with svc.engine.begin() as conn:
        token = issue_token(conn, audit.Actor.cli(), username, now=svc.clock.now())
    emit(as_json, {"username": username, "token": token},
         text=f"API token for {username} (shown once): {token}")


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
