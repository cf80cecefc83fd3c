"""The intake over real HTTP: body limits that the test client cannot exercise."""

from __future__ import annotations

import http.client
import json
import socket
import time

from tests.helpers import ledger_counts, make_sender, signed_headers


def _post_chunked(base_url: str, path: str, headers: dict[str, str], chunks: list[bytes]):
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", path)
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for chunk in chunks:
        conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def _read_all(sock: socket.socket) -> str:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data.decode()


def test_chunked_body_within_limit_is_accepted(app, live):
    sender = make_sender(app)
    body = json.dumps({"id": "evt_c", "type": "demo.credit", "data": {}}).encode()
    status, answer = _post_chunked(live, f"/hooks/{sender.public_id}",
                                   signed_headers(sender, body, "evt_c"),
                                   [body[:10], body[10:]])
    assert status == 202, answer


def test_chunked_body_over_limit_is_413(app, live):
    sender = make_sender(app, max_body_bytes=1000)
    body = json.dumps({"id": "evt_c", "type": "t", "pad": "x" * 5000}).encode()
    status, answer = _post_chunked(live, f"/hooks/{sender.public_id}",
                                   signed_headers(sender, body, "evt_c"),
                                   [body[i:i + 512] for i in range(0, len(body), 512)])
    assert (status, answer) == (413, {"error": "body_too_large"})
    assert ledger_counts(app)["receipts"] == 0


def test_declared_length_over_limit_is_refused_before_the_body_is_sent(app, live):
    sender = make_sender(app, max_body_bytes=1000)
    host, port = live.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # Announce 50 MB and send nothing: an answer proves nothing more was read.
        sock.sendall(
            f"POST /hooks/{sender.public_id} HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n".encode())
        started = time.monotonic()
        reply = _read_all(sock)
    assert reply.startswith("HTTP/1.1 413")
    assert '"body_too_large"' in reply
    assert time.monotonic() - started < 5


def test_body_longer_than_its_content_length_is_cut_at_the_declared_length(app, live):
    sender = make_sender(app)
    body = json.dumps({"id": "evt_l", "type": "demo.credit", "data": {}}).encode()
    headers = signed_headers(sender, body, "evt_l")
    host, port = live.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(f"POST /hooks/{sender.public_id} HTTP/1.1\r\nHost: x\r\n{head}"
                     f"Content-Length: 10\r\nConnection: close\r\n\r\n".encode() + body)
        reply = _read_all(sock)
    # Only the declared 10 bytes are read: they do not carry the signed body.
    assert reply.startswith("HTTP/1.1 401")
    assert ledger_counts(app)["receipts"] == 0
