"""The `ledger` command group (also `flask --app app ledger`)."""

from __future__ import annotations

import sys

from flask.cli import AppGroup, ScriptInfo

ledger_cli = AppGroup("ledger", help="Replay Ledger administration.")


def _register() -> None:
    """Attach every command module to the group (import order is the help order)."""
    from ledger.cli import (  # noqa: F401
        audit_cmds,
        credential_cmds,
        db_cmds,
        demo_cmds,
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

    info = ScriptInfo(create_app=create_app, set_debug_flag=False)
    ledger_cli.main(args=argv if argv is not None else sys.argv[1:], obj=info,
                    prog_name="ledger")
