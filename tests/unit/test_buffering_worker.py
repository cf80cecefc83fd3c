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
