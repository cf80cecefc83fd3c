"""Serve the app on a free loopback port from a thread (the leaked-key drill's target)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask
from werkzeug.serving import WSGIRequestHandler, make_server


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
