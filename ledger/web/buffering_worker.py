"""gunicorn's gthread worker, reading each request's head (and a small body) before a thread.

gthread hands a connection to a worker thread as soon as its first byte arrives, and
that thread then blocks reading the headers: 60 sockets sending one header line a
second held every thread of a 2 x 16 server and /healthz took 18 s (the body deadline,
web/body_deadline.py, starts only after the headers). Here the worker's event loop,
which waits on every socket anyway, reads what arrives without blocking and hands the
connection to a thread only once the request head is complete and, for a body up to
BUFFER_BODY_BYTES, the whole body too: a slow sender holds a buffer, never a thread.
A request still incomplete LEDGER_BODY_READ_TIMEOUT_SECONDS after its first byte is
answered 408 and closed, as the body deadline answers in the app. A larger body is
read by its thread under the body deadline. TLS connections (gunicorn's own
certfile) keep gthread's behaviour: terminate TLS in front (deploy/nginx-ledger.conf).
"""

from __future__ import annotations

import contextlib
import errno
import re
import selectors
import time
from email.utils import formatdate
from functools import partial
from typing import Any

from gunicorn import util  # type: ignore[import-untyped]
from gunicorn.http import wsgi as gunicorn_wsgi  # type: ignore[import-untyped]
from gunicorn.http2 import negotiation  # type: ignore[import-untyped]
from gunicorn.workers.gthread import TConn, ThreadWorker  # type: ignore[import-untyped]

BUFFER_BODY_BYTES = 1024 * 1024  # LEDGER_MAX_BODY_BYTES' default: most bodies fit
# Beyond this many buffered bytes per process, bodies go to threads as they come.
BUFFER_BUDGET_BYTES = 64 * 1024 * 1024
HEAD_LIMIT = 64 * 1024  # more than gunicorn's request line and header limits allow
DEFAULT_DEADLINE_SECONDS = 10.0
_END_OF_HEAD = b"\r\n\r\n"
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d{1,12})[ \t]*\r\n", re.I)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r\n]*chunked", re.I)
# A client that asked for `100 Continue` sends its body only after the app's answer.
_EXPECT = re.compile(rb"\r\nexpect:[ \t]*100-continue", re.I)
# What one non-blocking read of a buffered connection found (BufferingThreadWorker._receive).
READY, GONE, WAIT = object(), object(), object()
TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: 29\r\n\r\n"
                  b'{"error": "request_timeout"}\n')


_DATE: list[tuple[int, str]] = [(0, "")]


def http_date(timestamp: float | None = None) -> str:
    """Return the Date header's value, formatted once per second instead of per response.

    gunicorn formats it for every answer (email.utils.formatdate, about 2 % of a served
    delivery's CPU); the header has a resolution of one second, so the text is the same.
    """
    if timestamp is not None:
        return formatdate(timestamp, usegmt=True)
    second = int(time.time())
    cached, text = _DATE[0]
    if cached != second:
        text = formatdate(second, usegmt=True)
        _DATE[0] = (second, text)
    return text


# gunicorn's responses read util.http_date when they write their headers: this worker's
# responses (and the master's) use the cached one.
util.http_date = http_date

# An answer's head and its first body part go out in one send, not two.
GATHER_BYTES = 64 * 1024


class _Gathered:
    """Stands in for the socket while gunicorn writes an answer's head and first body part."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        """Keep what gunicorn would have sent."""
        self.parts.append(bytes(data))


_gunicorn_write = gunicorn_wsgi.Response.write


def write_with_head(response: Any, data: Any) -> None:
    """gunicorn's Response.write, whose first call sends the head and `data` together.

    gunicorn sends the head, then each body part: a small answer took two sends, two
    segments on the wire and two wake-ups of the client. Its own write runs unchanged
    (the checks, the body rules of HEAD and 204, the framing) against a stand-in that
    gathers the bytes, which then leave in one send.
    """
    if response.headers_sent or not isinstance(data, bytes) or len(data) > GATHER_BYTES:
        _gunicorn_write(response, data)
        return
    sock, gathered = response.sock, _Gathered()
    response.sock = gathered
    try:
        _gunicorn_write(response, data)
    finally:  # what gunicorn wrote goes out even if its write then raised, as it would have
        response.sock = sock
        if gathered.parts:
            sock.sendall(b"".join(gathered.parts))


# The ledger's gunicorn (this worker class) answers through it.
gunicorn_wsgi.Response.write = write_with_head


class BufferedConn(TConn):
    """A connection whose first bytes were read by the event loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Start with nothing buffered and no deadline (it starts with the first byte)."""
        super().__init__(*args, **kwargs)
        self.buffered = bytearray()
        self.deadline: float | None = None

    def init(self) -> None:
        """Create the parser as gthread does, then give it the bytes read so far."""
        fresh = not self.initialized
        super().init()
        if fresh:
            self.hand_over()

    def hand_over(self) -> None:
        """Put the buffered bytes back in front of the socket for the parser."""
        if self.buffered and self.parser is not None:
            self.parser.unreader.unread(bytes(self.buffered))
            self.buffered = bytearray()


def request_ready(buffered: bytes | bytearray) -> bool:
    """Tell whether a thread may take the request: head complete, small body complete."""
    end = buffered.find(_END_OF_HEAD)
    if end < 0:
        return len(buffered) > HEAD_LIMIT  # let the parser refuse the oversized head
    head = bytes(buffered[: end + 2])
    if _EXPECT.search(head):
        return True
    if _CHUNKED.search(head):
        return buffered.endswith(b"0\r\n\r\n") or len(buffered) > BUFFER_BODY_BYTES
    match = _LENGTH.search(head)
    length = int(match.group(1)) if match else 0
    return length > BUFFER_BODY_BYTES or len(buffered) - (end + 4) >= length


class BufferingThreadWorker(ThreadWorker):
    """gthread whose event loop reads request heads and small bodies (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Track the connections being buffered and their bytes."""
        super().__init__(*args, **kwargs)
        self.buffering: set[BufferedConn] = set()
        self.buffered_bytes = 0
        self._deadline: float | None = None

    def _deadline_seconds(self) -> float:
        """Return LEDGER_BODY_READ_TIMEOUT_SECONDS as the app read it (read once)."""
        if self._deadline is None:
            services = getattr(self.wsgi, "extensions", {}).get("ledger")
            settings = getattr(services, "settings", None)
            self._deadline = float(getattr(settings, "body_read_timeout_seconds",
                                           DEFAULT_DEADLINE_SECONDS))
        return self._deadline

    def accept(self, listener: Any) -> None:
        """Accept a connection and buffer its request in the event loop."""
        if self.cfg.is_ssl:
            super().accept(listener)
            return
        try:
            client_sock, client_addr = listener.accept()
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        client_sock.setblocking(True)
        if negotiation.prior_knowledge_allowed(self.cfg, client_addr):
            # gthread reads an HTTP/2 preface from the socket itself: leave it to gthread.
            self.enqueue_req(TConn(self.cfg, client_sock, client_addr, listener.getsockname()))
            return
        self._buffer(BufferedConn(self.cfg, client_sock, client_addr,
                                  listener.getsockname()))

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        """A kept-alive connection's next request: buffer it too."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._buffer(conn)

    def on_pending_socket_readable(self, conn: Any, client: Any) -> None:
        """A deferred connection's first bytes: buffer them."""
        self.poller.unregister(client)
        self.pending_conns.remove(conn)
        self._buffer(conn)

    def _buffer(self, conn: Any) -> None:
        """Read the connection's request now if it is there, else watch it until it is.

        The socket is usually readable already (a kept-alive connection's next request,
        a new one's first bytes), and most requests arrive in one read: they go to a
        thread at once, without a turn of the event loop or a poller registration.
        """
        if not isinstance(conn, BufferedConn):  # TLS or HTTP/2: gthread's own way
            conn.data_ready = True
            self.enqueue_req(conn)
            return
        conn.sock.setblocking(False)
        conn.deadline = None
        # A connection that sends nothing is closed after as long as gthread would wait.
        conn.timeout = time.monotonic() + max(self.cfg.keepalive, self._deadline_seconds())
        outcome = self._receive(conn)
        if outcome is READY:
            self._dispatch(conn)
        elif outcome is GONE:
            self._drop(conn)
        else:
            self.buffering.add(conn)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._read, conn))

    def _receive(self, conn: BufferedConn) -> object:
        """Read what arrived without blocking: READY, GONE, or WAIT for more."""
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return WAIT
        except OSError:
            chunk = b""
        if not chunk:  # the client went away before its request was complete
            return GONE
        if conn.deadline is None:
            conn.deadline = time.monotonic() + self._deadline_seconds()
        conn.buffered += chunk
        self.buffered_bytes += len(chunk)
        if request_ready(conn.buffered) or self.buffered_bytes > BUFFER_BUDGET_BYTES:
            return READY
        return WAIT

    def _read(self, conn: BufferedConn, _client: Any) -> None:
        """A watched connection is readable: hand the request over once it is ready."""
        outcome = self._receive(conn)
        if outcome is READY:
            self._dispatch(conn)
        elif outcome is GONE:
            self._drop(conn)

    def _forget(self, conn: BufferedConn) -> None:
        """Stop watching a buffered connection (if it was watched) and count its bytes out."""
        self.buffered_bytes -= len(conn.buffered)
        if conn in self.buffering:
            self.buffering.discard(conn)
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.poller.unregister(conn.sock)

    def _dispatch(self, conn: BufferedConn) -> None:
        """Give the connection and its bytes to a thread."""
        self._forget(conn)
        if conn.initialized:  # a kept-alive connection: its parser exists already
            conn.hand_over()
        conn.data_ready = True
        self.enqueue_req(conn)

    def _drop(self, conn: BufferedConn, answer: bytes = b"") -> None:
        """Close a connection whose request never became ready (408 when it was late)."""
        self._forget(conn)
        if answer:
            with contextlib.suppress(OSError):
                conn.sock.send(answer)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """Close deferred connections as gthread does, and requests past their deadline."""
        super().murder_pending()
        now = time.monotonic()
        late = [c for c in self.buffering if c.deadline is not None and c.deadline <= now]
        for conn in late:
            self._drop(conn, TIMEOUT_ANSWER)
        # An idle connection that never sent a byte is closed after the keepalive time.
        idle = [c for c in self.buffering if c.deadline is None and c.timeout is not None
                and c.timeout <= now]
        for conn in idle:
            self._drop(conn)

    def murder_keepalived(self, force: bool = False) -> None:
        """Close expired kept-alive connections; on stop, buffered ones too."""
        super().murder_keepalived(force)
        if force:
            for conn in list(self.buffering):
                self._drop(conn)
