"""A no-op destination for the bench: answers every request 200 with an empty body.

    python -m bench.noop_destination PORT

HTTP/1.1 with keep-alive, one thread per connection: the forwarder's pooled connections
stay open, so the measure sees the ledger's HTTP hop, not connection set-up.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class NoOp(BaseHTTPRequestHandler):
    """Read the body, answer 200 with nothing."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        """Drain the body and answer 200."""
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._empty()

    def do_GET(self) -> None:
        """Answer 200 (the bench's /healthz wait)."""
        self._empty()

    def _empty(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing: a line per request would be what is measured."""


def main() -> None:
    """Serve on 127.0.0.1:PORT until stopped."""
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), NoOp).serve_forever()


if __name__ == "__main__":
    main()
