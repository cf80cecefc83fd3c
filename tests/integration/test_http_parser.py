"""gunicorn's C HTTP parser holds the production limits the Python parser held.

gunicorn.conf.py serves with gunicorn_h1c (`http_parser = "fast"`) for its lower CPU
per request; `--http-parser python` is the documented way back. Both must answer a
sender and an abuser alike, over raw sockets against gunicorn with gunicorn.conf.py:
a signed event sent chunked is accepted once, a malformed chunked body is refused
without a receipt; oversized request lines, header fields and header counts, malformed
header lines and the ambiguous framings request smuggling relies on (a length with a
transfer coding, two lengths, an unknown coding) are refused before the app sees them.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.helpers import event_body, ledger_counts, make_sender, signed_headers
from tests.servers import gunicorn_server

PARSERS = ("fast", "python")
CRLF = "\r\n"


def _exchange(base_url: str, request: bytes) -> bytes:
    """Send one raw request; return everything the server sent until it closed."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def _status(base_url: str, request: bytes) -> int:
    """Return the status of the answer to one raw request (0: closed without one)."""
    answer = _exchange(base_url, request)
    return int(answer.split(b" ", 2)[1]) if answer else 0


def _head(method: str, target: str, headers: dict[str, str]) -> str:
    lines = [f"{method} {target} HTTP/1.1", "Host: ledger.test", "Connection: close",
             *(f"{name}: {value}" for name, value in headers.items())]
    return CRLF.join(lines) + CRLF


def _chunked_delivery(path: str, headers: dict[str, str], chunks: list[bytes]) -> bytes:
    head = _head("POST", path, {**headers, "Transfer-Encoding": "chunked"})
    body = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    return (head + CRLF).encode() + body


@pytest.fixture(params=PARSERS)
def served(request, app, test_env):  # type: ignore[no-untyped-def]
    """The ledger under gunicorn.conf.py with the parser of the param."""
    args = ("--http-parser", request.param)
    with gunicorn_server(test_env, workers=1, extra_args=args) as (base_url, _):
        yield base_url


def test_a_signed_event_sent_chunked_is_accepted_and_a_malformed_one_is_refused(app, served):
    sender = make_sender(app)
    body = event_body(sender, "evt_chunked_ok")
    path = f"/hooks/{sender.public_id}"
    ok = _chunked_delivery(path, signed_headers(sender, body, "evt_chunked_ok"),
                           [body[:7], body[7:]])
    assert _status(served, ok) == 202
    again = _exchange(served, ok)  # the same delivery again: answered from its receipt
    assert again.startswith(b"HTTP/1.1 202")
    assert json.loads(again.split(b"\r\n\r\n", 1)[1])["status"] == "duplicate"
    bad_body = json.dumps({"id": "evt_chunked_bad", "type": "demo.credit"}).encode()
    head = _head("POST", path, {**signed_headers(sender, bad_body, "evt_chunked_bad"),
                                "Transfer-Encoding": "chunked"})
    malformed = (head + CRLF).encode() + b'5\r\n{"id":\r\nzz\r\nnot a chunk\r\n0\r\n\r\n'
    assert _status(served, malformed) == 400
    assert ledger_counts(app)["receipts"] == 1


def _get(target: str, headers: dict[str, str]) -> bytes:
    return (_head("GET", target, headers) + CRLF).encode()


def _post(head: str, body: str) -> bytes:
    """A POST to an unknown integration: only the server's framing decides its answer."""
    return (f"POST /hooks/in_unknown HTTP/1.1\r\nHost: ledger.test\r\nConnection: close\r\n"
            f"{head}\r\n{body}").encode()


ABUSES = {  # the answer gunicorn gives, each before the app sees the request
    # gunicorn.conf.py's limits, each passed
    "request line of 5,000 bytes (limit 4094)": (_get("/healthz?" + "a" * 5000, {}), 414),
    "header field of 9,000 bytes (limit 8190)": (_get("/healthz", {"X-Big": "a" * 9000}), 431),
    "100 header fields (limit 64)": (_get("/healthz", {f"X-H{i}": "v" for i in range(100)}), 431),
    # malformed header fields
    "a control character in a header": (_get("/healthz", {"X-Bad": "a\x01b"}), 400),
    "a space before the colon": (_get("/healthz", {"X-Bad ": "a"}), 400),
    "a folded header line": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400),
    # framing a proxy in front could read another way (request smuggling)
    "Content-Length and Transfer-Encoding": (
        _post("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"), 400),
    "two Content-Length values": (_post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello"),
                                  400),
    "a signed Content-Length": (_post("Content-Length: +5\r\n", "hello"), 400),
    "an unknown transfer coding": (_post("Transfer-Encoding: gzip\r\n", ""), 400),
    "chunked twice": (_post("Transfer-Encoding: chunked, chunked\r\n", "0\r\n\r\n"), 400),
}


def test_oversized_and_malformed_requests_are_refused_before_the_app(served):
    answers = {name: _status(served, request) for name, (request, _) in ABUSES.items()}
    assert answers == {name: status for name, (_, status) in ABUSES.items()}
    within = _head("GET", "/healthz", {f"X-H{i}": "v" for i in range(30)})
    assert _status(served, (within + CRLF).encode()) == 200
