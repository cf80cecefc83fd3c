"""When the buffering worker hands a request to a thread: a complete head, and a small body
in full (web/buffering_worker.py)."""

from __future__ import annotations

import pytest

from ledger.web.buffering_worker import BUFFER_BODY_BYTES, HEAD_LIMIT, request_ready

HEAD = b"POST /hooks/in_x HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(("buffered", "ready"), [
    (b"POST /hooks/in_x HTTP/1.1\r\n", False),  # a head still arriving
    (HEAD + b"X-Pad: 1\r\n", False),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", True),  # no body
    (HEAD + b"Content-Length: 10\r\n\r\n{}", False),  # a body still arriving
    (HEAD + b"Content-Length: 2\r\n\r\n{}", True),
    (HEAD + b"content-length:2\r\n\r\n{}", True),
    (HEAD + b"Content-Length: %d\r\n\r\n" % (BUFFER_BODY_BYTES + 1), True),  # a thread reads it
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n", False),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", True),
    (HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n", True),  # waits for 100
    (b"X" * (HEAD_LIMIT + 1), True),  # no end of head in sight: the parser refuses it
])
def test_a_request_is_ready_for_a_thread_once_it_can_be_read_without_waiting(
        buffered: bytes, ready: bool) -> None:
    assert request_ready(buffered) is ready


def test_the_date_header_is_the_current_second_formatted_as_http_wants(monkeypatch):
    from email.utils import formatdate

    from gunicorn import util

    from ledger.web import buffering_worker

    clock = [1_800_000_000.25]
    monkeypatch.setattr(buffering_worker.time, "time", lambda: clock[0])
    assert util.http_date is buffering_worker.http_date  # what gunicorn's responses call
    assert util.http_date() == formatdate(1_800_000_000, usegmt=True)
    clock[0] = 1_800_000_001.9  # the next second: a new text, not the cached one
    assert util.http_date() == "Fri, 15 Jan 2027 08:00:01 GMT"
    assert util.http_date(86_400.0) == "Fri, 02 Jan 1970 00:00:00 GMT"


class _Socket:
    """Records what a response sends, one entry per send."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))


class _Request:
    def __init__(self, method: str = "POST") -> None:
        self.method, self.version, self.path = method, (1, 1), "/hooks/in_x"

    def should_close(self) -> bool:
        return False


def _answer(body: bytes, *, method: str = "POST", status: str = "202 Accepted",
            length: bool = True) -> list[bytes]:
    """Answer through gunicorn's Response as the ledger's server does; return the sends."""
    from gunicorn.config import Config
    from gunicorn.http.wsgi import Response

    import ledger.web.buffering_worker  # noqa: F401  # installs the gathered write

    sock = _Socket()
    response = Response(_Request(method), sock, Config())
    headers = [("Content-Type", "application/json")]
    if length:
        headers.append(("Content-Length", str(len(body))))
    response.start_response(status, headers)
    response.write(body)
    response.close()
    return sock.sends


def test_a_small_answer_leaves_in_one_send_head_and_body():
    body = b'{"status":"accepted"}\n'
    sends = _answer(body)
    assert len(sends) == 1
    head, _, sent_body = sends[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 202 Accepted\r\n")
    assert b"Content-Length: %d" % len(body) in head and sent_body == body


def test_the_gathered_answer_keeps_gunicorns_body_rules_and_framing():
    head_only = _answer(b'{"status":"ok"}', method="HEAD", status="200 OK")
    assert len(head_only) == 1 and head_only[0].endswith(b"\r\n\r\n")  # HEAD: no body
    no_content = _answer(b"", status="204 No Content")
    assert len(no_content) == 1 and no_content[0].endswith(b"\r\n\r\n")
    chunked = b"".join(_answer(b"abc", length=False))
    assert b"Transfer-Encoding: chunked" in chunked and chunked.endswith(b"3\r\nabc\r\n0\r\n\r\n")


def test_a_large_body_is_sent_as_gunicorn_sends_it():
    from ledger.web.buffering_worker import GATHER_BYTES

    body = b"x" * (GATHER_BYTES + 1)
    sends = _answer(body)
    assert len(sends) == 2 and sends[1] == body
