"""A deadline on reading each request body: a slow sender gets 408 and frees its thread.

Without one, a sender that sends its headers and then trickles the body holds a
server thread for as long as it likes: ten such sockets stopped a 4 x 4 server
(issue 14, finding 4). gunicorn has no body read timeout (its `timeout` watches
workers, not requests), and a socket timeout would bound each recv() only: a
sender trickling one byte just before each timeout would still hold the thread.

So one watchdog thread per process keeps the deadlines of the bodies being read
and, when one passes, shuts that connection's socket for reading (SHUT_RD). The
blocked read returns at once, `DeadlineInput` turns it into `BodyReadTimeout`
(408), and the answer still goes out on the open write side. A body read in
time costs a lock and a deque append.

It needs the server to hand the app the connection's socket: gunicorn does
(`gunicorn.socket`), so does werkzeug's server (`werkzeug.socket`, `ledger
dev`). Under a server that does not, bodies are read without this deadline
(README, "Production layout", says which servers carry it).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from flask import Flask
from werkzeug.exceptions import RequestTimeout

SOCKET_KEYS = ("gunicorn.socket", "werkzeug.socket")


class BodyReadTimeout(RequestTimeout):
    """The request body did not arrive within LEDGER_BODY_READ_TIMEOUT_SECONDS."""

    description = "The request body did not arrive in time."


@dataclass(slots=True, eq=False)
class Watch:
    """One body being read: its socket, its deadline, and whether the deadline passed."""

    sock: socket.socket
    deadline: float
    done: bool = False
    expired: bool = False


class Watchdog:
    """Shuts the read side of sockets whose body is still unread at its deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Every deadline is now + the same `seconds`: arrival order is deadline order.
        self._queue: deque[Watch] = deque()
        self._pid: int | None = None
        self._idle = False  # the thread waits for a first entry, with no deadline to keep

    def watch(self, sock: socket.socket) -> Watch:
        """Start the deadline of one body read on `sock`."""
        with self._lock:
            if self._pid != os.getpid():  # first use in this (possibly forked) process
                self._pid = os.getpid()
                self._queue.clear()
                self._idle = False
                threading.Thread(target=self._run, name="body-deadline", daemon=True).start()
            entry = Watch(sock, time.monotonic() + self.seconds)
            self._queue.append(entry)
            if self._idle:  # otherwise the thread already sleeps until an earlier deadline
                self._idle = False
                self._wake.notify()
        return entry

    def release(self, entry: Watch) -> None:
        """End a body's deadline; once this returns its socket is never touched again."""
        with self._lock:
            entry.done = True

    def _run(self) -> None:
        # The thread wakes only at the oldest entry's deadline (or for the first entry
        # after the queue ran empty), never per request: a body read in time stays in the
        # queue until the oldest deadline comes, and then every finished body at the head
        # leaves together, whatever its own deadline. Waking at each entry's deadline,
        # or when each body ends, cost a thread switch per delivery: a body already
        # buffered by the server is read before the thread gets to run.
        while True:
            with self._lock:
                if not self._queue:
                    self._idle = True
                    self._wake.wait()
                    continue
                delay = self._queue[0].deadline - time.monotonic()
                if delay > 0:
                    self._wake.wait(delay)
                    continue
                self._expire_head()

    def _expire_head(self) -> None:
        """Drop the finished bodies at the head; cut off the first unfinished one (lock held).

        Called once the oldest deadline has passed; the unfinished entry at the head
        is cut off only if its own deadline has passed too.
        """
        queue = self._queue
        while queue and queue[0].done:
            queue.popleft()
        if not queue or queue[0].deadline > time.monotonic():
            return
        entry = queue.popleft()
        entry.expired = True
        # Under the lock: after release() returns, the socket (which the server may
        # reuse for the next request) is never shut here.
        with suppress(OSError):
            entry.sock.shutdown(socket.SHUT_RD)


class DeadlineInput:
    """`wsgi.input` whose reads raise BodyReadTimeout once the body's deadline passed.

    The deadline starts at the first read, not when the request arrives: time the
    app spends before it reads (an integration looked up while the database
    stalls) is the server's, and must end in 503, never in a 408 that blames the
    sender.
    """

    def __init__(self, inner: Any, watchdog: Watchdog, sock: socket.socket,
                 length: int | None) -> None:
        self._inner = inner
        self._watchdog = watchdog
        self._sock = sock
        self._entry: Watch | None = None
        self._left = length

    def release(self) -> None:
        """End the deadline if it started; the socket is never touched again."""
        if self._entry is not None:
            self._watchdog.release(self._entry)

    def _checked(self, read: Callable[[], bytes]) -> bytes:
        entry = self._entry
        if entry is None:
            entry = self._entry = self._watchdog.watch(self._sock)
        try:
            data = read()
        except OSError:
            if entry.expired:
                raise BodyReadTimeout() from None
            raise
        if entry.expired:
            raise BodyReadTimeout()
        if self._left is not None:
            self._left -= len(data)
        if not data or self._left == 0:
            self._watchdog.release(entry)  # the whole body is in: no more deadline
        return data

    def read(self, size: int | None = -1) -> bytes:
        """Read up to `size` bytes (all when negative or None)."""
        return self._checked(lambda: self._inner.read(-1 if size is None else size))

    def readline(self, size: int | None = -1) -> bytes:
        """Read one line of at most `size` bytes."""
        return self._checked(lambda: self._inner.readline(-1 if size is None else size))

    def readlines(self, hint: int = -1) -> list[bytes]:
        """Read the remaining lines."""
        lines: list[bytes] = []
        for line in self:
            lines.append(line)
            if 0 < hint <= sum(map(len, lines)):
                break
        return lines

    def __iter__(self) -> Iterator[bytes]:
        """Yield the body line by line."""
        while line := self.readline():
            yield line


def _body_length(environ: dict[str, Any]) -> tuple[bool, int | None]:
    """Return whether the request has a body and its declared length (None: chunked)."""
    raw = environ.get("CONTENT_LENGTH")
    if raw:
        with suppress(ValueError):  # the server refuses a malformed length before the app
            length = int(raw)
            return length > 0, length
        return False, None
    return bool(environ.get("HTTP_TRANSFER_ENCODING")), None


class BodyDeadline:
    """WSGI middleware: give every request body LEDGER_BODY_READ_TIMEOUT_SECONDS to arrive."""

    def __init__(self, inner: Callable[..., Iterable[bytes]], seconds: float) -> None:
        self._inner = inner
        self.watchdog = Watchdog(seconds)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        """Serve the request with its body under the deadline."""
        has_body, length = _body_length(environ)
        sock = next((environ[k] for k in SOCKET_KEYS if k in environ), None)
        if not has_body or sock is None:
            return self._inner(environ, start_response)
        body = DeadlineInput(environ["wsgi.input"], self.watchdog, sock, length)
        environ["wsgi.input"] = body
        try:
            return self._inner(environ, start_response)
        finally:
            body.release()


def init_app(app: Flask, seconds: float) -> None:
    """Put the body deadline in front of everything (the intake's fast path included)."""
    # why: wrapping the wsgi_app attribute is Flask's documented middleware hook; mypy sees a
    # method being replaced.
    app.wsgi_app = BodyDeadline(app.wsgi_app, seconds)  # type: ignore[method-assign]
