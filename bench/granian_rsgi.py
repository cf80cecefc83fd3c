"""The ledger's WSGI app behind granian's RSGI interface, each body read on the event loop.

Not the shipped server and not in the Procfile: `python -m bench.run --only granian`
measures it beside granian's own WSGI interface (bench/granian_intake.py). Under the WSGI
interface granian hands a request to a thread as soon as its head has arrived, and the
app's read of `wsgi.input` waits for the body with no deadline. Here each process's event
loop reads the whole body first, within LEDGER_BODY_READ_TIMEOUT_SECONDS (408 and the
connection closed otherwise), and refuses one declared or streamed past MAX_BODY_BYTES
(413, the rest unread). Only then is the app called, on the loop itself: a process runs one
request at a time, as a sync worker does, while slow senders wait as coroutines, never
holding the process. granian's own `--http1-header-read-timeout` bounds the head.

Its limits against the shipped server's: a body over the integration's own limit but under
MAX_BODY_BYTES (the largest limit an integration may set) is read whole before the app
answers 413; gunicorn.conf.py's head limits (request line, header count and size) are
granian's own HTTP/1 buffer limit instead; an answer the app streams (an export) is
gathered whole before it is sent. /metrics sums every process only when
PROMETHEUS_MULTIPROC_DIR names a directory the processes share (granian has no hook to make
one before its workers start, as gunicorn.conf.py does), and a stopped worker's live
gauges are not dropped.

    granian --interface rsgi --factory --workers N bench.granian_rsgi:create
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import Iterable
from typing import Any

from flask import Flask

from ledger.access.integrations import MAX_BODY_BYTES_LIMIT as MAX_BODY_BYTES
from ledger.config import declared
from ledger.web.buffering_worker import TIMEOUT_ANSWER

# The shipped server's own 408 body; 413's is the intake's answer to a body too large.
TIMEOUT_BODY = TIMEOUT_ANSWER.split(b"\r\n\r\n", 1)[1]
TOO_LARGE_BODY = b'{"error": "body_too_large"}\n'
_CLOSE = [("content-type", "application/json"), ("connection", "close")]


class BodyTooLarge(Exception):
    """The body is declared or streamed past MAX_BODY_BYTES."""


async def read_body(proto: Any, declared_length: str | None, limit: int) -> bytes:
    """Return the request body, refusing one past `limit` before reading the rest."""
    if declared_length is not None:
        if int(declared_length) > limit:  # hyper has refused a malformed length
            raise BodyTooLarge
        return bytes(await proto())
    chunks: list[bytes] = []
    size = 0
    async for chunk in proto:  # chunked: count as it streams
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def environ_of(scope: Any, body: bytes) -> dict[str, Any]:
    """Return the WSGI environ of an RSGI request whose body has been read."""
    host, _, port = str(scope.server).rpartition(":")
    client, _, client_port = str(scope.client).rpartition(":")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope.method, "SCRIPT_NAME": "", "PATH_INFO": scope.path,
        "QUERY_STRING": scope.query_string, "SERVER_NAME": host, "SERVER_PORT": port,
        "SERVER_PROTOCOL": f"HTTP/{scope.http_version}", "REMOTE_ADDR": client,
        "REMOTE_PORT": client_port, "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.scheme, "wsgi.multithread": False,
        "wsgi.multiprocess": True, "wsgi.run_once": False}
    for name, value in scope.headers.items():
        if name == "content-length" or name == "transfer-encoding":
            continue  # the body is whole: its length is CONTENT_LENGTH
        key = "CONTENT_TYPE" if name == "content-type" else "HTTP_" + name.upper().replace(
            "-", "_")
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


class Adapter:
    """Serve a WSGI app on granian's RSGI interface, bodies read within a deadline."""

    def __init__(self, app: Flask, deadline_seconds: float) -> None:
        self.app = app
        self.deadline_seconds = deadline_seconds

    def _call(self, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return None

        result: Iterable[bytes] = self.app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return int(started[0][:3]), started[1], body

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        """Read the body within the deadline, then answer with the app, on the loop."""
        try:
            body = await asyncio.wait_for(
                read_body(proto, scope.headers.get("content-length"), MAX_BODY_BYTES),
                self.deadline_seconds)
        except TimeoutError:
            proto.response_bytes(408, _CLOSE, TIMEOUT_BODY)
            return
        except BodyTooLarge:
            proto.response_bytes(413, _CLOSE, TOO_LARGE_BODY)
            return
        status, headers, payload = self._call(environ_of(scope, body))
        proto.response_bytes(status, headers, payload)


def create() -> Adapter:
    """Build the ledger's app (app.create_app) behind the adapter, deadline from the env."""
    from app import create_app

    seconds = float(declared("LEDGER_BODY_READ_TIMEOUT_SECONDS").read(os.environ))
    return Adapter(create_app(), seconds)
