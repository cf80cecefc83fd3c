"""The thread-served app (the drill's target, the browser tests' server) closes every response,
also when the client resets the connection halfway through it."""

from __future__ import annotations

import gc
import socket
import struct
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from ledger.web.loopback import local_server

# SO_LINGER on with a zero timeout: close() sends a reset instead of a FIN.
_RESET = struct.pack("ii", 1, 0)


def test_a_client_that_resets_mid_response_leaves_no_file_open(
        app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with local_server(app) as base:
        port = urlsplit(base).port
        for _ in range(100):  # a leak came 16 times in 100 before the fix
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /static/htmx-2.0.11.min.js HTTP/1.1\r\nHost: t\r\n\r\n")
                assert sock.recv(12).startswith(b"HTTP/1.1 200")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        time.sleep(0.5)  # the server's threads finish their requests
        gc.collect()
        leaked = [str(u.exc_value) for u in unraisable if isinstance(u.exc_value, ResourceWarning)]
        assert leaked == []  # before the fix: "unclosed file ... static/htmx ..." for 1 in 6
        # The server still answers.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
