"""`ledger drill`: the leaked-key drill over real HTTP, against BASE or a server it starts."""

from __future__ import annotations

import sys

import click

from ledger.access import audit
from ledger.cli import ledger_cli
from ledger.cli.common import current_flask_app, emit, json_option, services
from ledger.drill.run import run_drill
from ledger.web.loopback import local_server


@ledger_cli.command("drill")
@click.option("--url", "base_url", default=None,
              help="Base URL of a running server on this DATABASE_URL (default: start one).")
@json_option
def drill(base_url: str | None, as_json: bool) -> None:
    """Run the leaked-key drill on two fresh sandbox accounts; exit 1 unless it passes."""
    svc = services()
    actor = audit.Actor.cli()
    if base_url:
        report = run_drill(base_url, svc, actor=actor)
    else:
        app = current_flask_app()
        with local_server(app) as url:
            report = run_drill(url, svc, actor=actor)
        if svc.heartbeat is not None:
            svc.heartbeat.stop()  # the local server is gone: so is its instance
    lines = [f"{'PASS' if s.passed else 'FAIL'}  {s.name}: {s.detail}" for s in report.steps]
    lines.append("drill passed" if report.passed else "drill FAILED")
    emit(as_json, report.to_json(), text="\n".join(lines))
    if not report.passed:
        sys.exit(1)
