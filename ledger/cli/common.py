"""Helpers every CLI command shares: services, output, error → exit code."""

from __future__ import annotations

import functools
import getpass
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

import click
from flask import Flask, current_app
from werkzeug.local import LocalProxy

from ledger.errors import LedgerError, NotFound
from ledger.services import Services

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def services(*, serving: bool = False) -> Services:
    """Return the current app's services.

    A CLI command does not serve HTTP, so its process never registers as a web
    instance, not even when it posts through a test client (`ledger demo seed`):
    it would stay listed, as a lagging instance, after the command exits. Only
    `ledger dev`, which serves, passes `serving=True`.
    """
    svc: Services = current_app.extensions["ledger"]
    if not serving and svc.heartbeat is not None:
        svc.heartbeat.disable()
    return svc


def current_flask_app() -> Flask:
    """Return the app behind the `current_app` proxy (to hand to a server or a thread)."""
    # Flask types current_app as the app itself; it is a LocalProxy of one.
    return cast("LocalProxy[Flask]", current_app)._get_current_object()


def emit(as_json: bool, payload: Mapping[str, Any], text: str | None = None) -> None:
    """Print the result: one JSON object with --json, readable text otherwise."""
    if as_json:
        click.echo(json.dumps(payload, sort_keys=False))
    else:
        click.echo(text if text is not None else json.dumps(payload, indent=2))


def read_stdin_secret(label: str) -> str:
    """Read one secret line from stdin (never echoed, never logged).

    On a terminal the line is read with echo off (getpass), so the secret never shows
    on the screen or in a screen recording; from a pipe it is read as it comes.
    """
    if sys.stdin.isatty():
        value = getpass.getpass(f"{label}: ", stream=sys.stderr)
    else:
        value = sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise click.UsageError(f"--{label}-stdin given but stdin held no {label}")
    return value


def handles_ledger_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn refused actions and missing records into exit code 1 with a clear message."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LedgerError as error:
            kind = "not_found" if isinstance(error, NotFound) else "refused"
            if kwargs.get("as_json"):
                click.echo(json.dumps({"error": kind, "detail": str(error)}))
            click.echo(f"error: {error}", err=True)
            sys.exit(1)

    return wrapper
