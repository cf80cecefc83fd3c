"""The `ledger` command group (also `flask --app app ledger`).

Each command's module is imported only when that command runs (COMMANDS names it), so
`ledger --help` imports neither the database layer nor the web app. A command that serves
nothing gets an app with the ledger's services and no web pages (`ledger.app.create_cli_app`);
only those in SERVING build the whole web app.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import click
from flask import Flask
from flask.cli import AppGroup, ScriptInfo

from ledger.config import SettingsError

# name -> (the module that defines it, its one-line help for `ledger --help`). The help is
# the command's own first line; tests/unit/test_cli_lazy.py fails when the two differ.
COMMANDS: dict[str, tuple[str, str]] = {
    "audit": ("ledger.cli.audit_cmds", "The append-only audit log."),
    "capacity": ("ledger.cli.scheduler_cmds",
                 "Measure bytes per receipt and project events/day x retention days x bytes."),
    "credential": ("ledger.cli.credential_cmds",
                   "Signing credentials: add, rotate, revoke, list."),
    "db": ("ledger.cli.db_cmds", "Database schema."),
    "demo": ("ledger.cli.demo_cmds", "The demo ledger used by `make run`."),
    "destination": ("ledger.cli.destination_cmds",
                    "Destinations: an integration's events forwarded to an HTTP endpoint."),
    "dev": ("ledger.cli.dev_cmds", "Serve the dashboard and intake with a worker and the "
                                   "scheduler in one process."),
    "drill": ("ledger.cli.drill_cmds", "Run the leaked-key drill on two fresh sandbox "
                                       "accounts; exit 1 unless it passes."),
    "integration": ("ledger.cli.integration_cmds",
                    "Integrations: one sender connected to one account."),
    "operator": ("ledger.cli.operator_cmds",
                 "Dashboard operators: accounts, roles and API tokens."),
    "purge": ("ledger.cli.scheduler_cmds", "Expire finished receipts older than the retention "
                                           "and drop reviewed failed payloads."),
    "receipt": ("ledger.cli.receipt_cmds", "Receipts: one per (scope, event id)."),
    "scheduler": ("ledger.cli.scheduler_cmds", "Run the scheduled jobs until stopped (any "
                                               "number of instances; each job runs once per "
                                               "period across all of them)."),
    "secrets": ("ledger.cli.secrets_cmds",
                "Stored signing secrets (encrypted at rest under LEDGER_MASTER_KEY)."),
    "worker": ("ledger.cli.worker_cmds", "Claim due jobs and run their handlers; "
                                         "SIGTERM/SIGINT finish the current job first."),
}
# Commands that serve HTTP (or post through the app): they need the whole web app.
SERVING = frozenset({"dev", "drill", "demo"})


class LazyGroup(AppGroup):
    """A group that imports a command's module only when the command is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Return every command name, loaded or not."""
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Return the command, importing the module that defines it first."""
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name][0])
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with their one-line help, without importing any of them."""
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows: list[tuple[str, str]] = []
        for name in self.list_commands(ctx):
            loaded = self.commands.get(name)
            rows.append((name, loaded.get_short_help_str(limit) if loaded
                         else _shortened(COMMANDS[name][1], limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _shortened(text: str, limit: int) -> str:
    """Cut `text` at a word boundary to fit `limit`, as click shortens a command's help."""
    if len(text) <= limit:
        return text
    return text[:limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."


ledger_cli = LazyGroup("ledger", help="Replay Ledger administration.")


class SettingsRefused(click.ClickException):
    """A setting is malformed or missing: the command stops before it starts, exit 2."""

    exit_code = 2


def _factory(args: list[str]) -> Callable[[], Flask]:
    """Return the app factory the command in `args` needs (the web app only if it serves)."""
    command = next((arg for arg in args if not arg.startswith("-")), None)

    def create_checked_app() -> Flask:
        from ledger import app

        create: Callable[..., Any] = (app.create_app if command in SERVING
                                      else app.create_cli_app)
        try:
            built: Flask = create()
        except SettingsError as error:
            raise SettingsRefused(str(error)) from None
        return built

    return create_checked_app


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `ledger` console script."""
    args = argv if argv is not None else sys.argv[1:]
    info = ScriptInfo(create_app=_factory(args), set_debug_flag=False)
    ledger_cli.main(args=args, obj=info, prog_name="ledger")
