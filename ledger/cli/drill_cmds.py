"""`ledger drill`: the leaked-key drill over real HTTP, against BASE or a server it starts."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import click
from flask import Flask
from werkzeug.serving import WSGIRequestHandler, make_server

from ledger.access import audit
from ledger.cli import ledger_cli
from ledger.cli.common import current_flask_app, emit, json_option, services
from ledger.drill.run import run_drill


class _QuietHandler(WSGIRequestHandler):
    """The ledger logs every delivery itself; skip werkzeug's access lines."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log nothing."""


@contextmanager
def local_server(app: Flask, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` on a free loopback port from a thread; yield its base URL; stop it."""
    server = make_server(host, 0, app, threaded=True, request_handler=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="ledger-drill-server",
                              daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


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
