"""Serve the app on a free loopback port from a thread (the leaked-key drill's target, tests).

werkzeug's server closes a response's iterable in a `finally` that first drains the
client's socket; when the client reset the connection (a browser dropping a favicon
fetch as it navigates away), the drain raises, the close is skipped, and a static file
stays open until the garbage collector finds it. The handler here closes every response
itself once the request is over (once: a second close does nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

_BODY = "ledger.loopback.body"  # the environ key of the request's response iterable


class _ClosedOnce:
    """A response iterable whose `close` reaches the app's iterable exactly once."""

    __slots__ = ("_closed", "_iterable")

    def __init__(self, iterable: Iterable[bytes]) -> None:
        self._iterable = iterable
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._iterable)

    def close(self) -> None:
        """Close the app's iterable, unless that was done before."""
        if not self._closed:
            self._closed = True
            close = getattr(self._iterable, "close", None)
            if close is not None:
                close()


def _closing(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """Wrap `app` so that its handler can close each response, whatever happened."""
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = environ[_BODY] = _ClosedOnce(app(environ, start_response))
        return body
    return serve


class _Handler(WSGIRequestHandler):
    """The ledger logs every request itself; werkzeug's access lines are skipped."""

    def run_wsgi(self) -> None:
        """Serve the request, then close its response even if the client went away."""
        try:
            super().run_wsgi()
        finally:
            body = getattr(self, "environ", {}).get(_BODY)
            if body is not None:
                body.close()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log nothing."""


def loopback_server(app: Flask, host: str = "127.0.0.1") -> BaseWSGIServer:
    """Return a threaded werkzeug server of `app` on a free port of `host` (not started)."""
    return make_server(host, 0, _closing(app), threaded=True, request_handler=_Handler)


@contextmanager
def local_server(app: Flask, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` on a free loopback port from a thread; yield its base URL; stop it."""
    server = loopback_server(app, host)
    thread = threading.Thread(target=server.serve_forever, name="ledger-drill-server",
                              daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
