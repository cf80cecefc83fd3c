"""The `ledger` command group (also `flask --app app ledger`)."""

from __future__ import annotations

import sys

import click
from flask import Flask
from flask.cli import AppGroup, ScriptInfo

from ledger.config import SettingsError

ledger_cli = AppGroup("ledger", help="Replay Ledger administration.")


class SettingsRefused(click.ClickException):
    """A setting is malformed or missing: the command stops before it starts, exit 2."""

    exit_code = 2


def _register() -> None:
    """Attach every command module to the group (import order is the help order)."""
    from ledger.cli import (  # noqa: F401
        audit_cmds,
        credential_cmds,
        db_cmds,
        demo_cmds,
        destination_cmds,
        dev_cmds,
        drill_cmds,
        integration_cmds,
        operator_cmds,
        receipt_cmds,
        scheduler_cmds,
        secrets_cmds,
        worker_cmds,
    )


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `ledger` console script."""
    from app import create_app

    def create_checked_app() -> Flask:
        try:
            return create_app()
        except SettingsError as error:
            raise SettingsRefused(str(error)) from None

    info = ScriptInfo(create_app=create_checked_app, set_debug_flag=False)
    ledger_cli.main(args=argv if argv is not None else sys.argv[1:], obj=info,
                    prog_name="ledger")
