"""The `ledger` group loads a command's module only when it runs, and its help cannot drift."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from ledger.cli import COMMANDS, ledger_cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_listed_help_is_the_commands_own(name: str) -> None:
    command = ledger_cli.get_command(click.Context(ledger_cli), name)
    assert command is not None
    assert COMMANDS[name][1] == command.get_short_help_str(limit=1000)
    assert command.callback is None or command.callback.__module__ == COMMANDS[name][0]


def test_every_registered_command_is_listed() -> None:
    context = click.Context(ledger_cli)
    for name in COMMANDS:
        ledger_cli.get_command(context, name)
    assert set(ledger_cli.commands) == set(COMMANDS)


def test_help_imports_neither_the_database_layer_nor_the_web_app() -> None:
    script = ("import sys\n"
              "from ledger.cli import main\n"
              "try:\n    main(['--help'])\nexcept SystemExit as done:\n    assert not done.code\n"
              "heavy = sorted(m for m in ('sqlalchemy', 'psycopg', 'alembic', 'flask_wtf',\n"
              "               'ledger.services', 'ledger.web') if m in sys.modules)\n"
              "print('HEAVY', heavy)")
    done = subprocess.run([sys.executable, "-W", "error", "-c", script], capture_output=True,
                          text=True, timeout=60, check=True)
    assert "HEAVY []" in done.stdout, done.stdout
    assert "receipt" in done.stdout and done.stderr == ""
