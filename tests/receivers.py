"""A receiving service for destination tests: records each request, answers as scripted."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.servers import thread_server

# No answer is held longer than this, whatever a test does (a server thread never hangs).
HOLD_LIMIT_SECONDS = 30.0


@dataclass
class Answer:
    """One scripted answer: status, headers, body; `hold` keeps it back until the test ends."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    hold: bool = False
    drip_every: float | None = None  # send the body a byte at a time, this far apart


@dataclass(frozen=True)
class Received:
    """One request as the receiving service saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A WSGI app: answers from a script (then `default`) and keeps every request."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: deque[Answer] = deque()
        self.default = Answer()
        self.released = threading.Event()  # set at the end: every held answer goes out

    def answer(self, *answers: Answer) -> None:
        """Queue answers for the next requests."""
        self.script.extend(answers)

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        self.requests.append(Received(environ["REQUEST_METHOD"], environ["PATH_INFO"],
                                      headers, body))
        answer = self.script.popleft() if self.script else self.default
        if answer.hold:
            self.released.wait(HOLD_LIMIT_SECONDS)
        start_response(f"{answer.status} X", [("Connection", "close"),
                                              *answer.headers.items()])
        if answer.drip_every is not None:
            return self._drip(answer.body, answer.drip_every)
        return [answer.body]

    def _drip(self, body: bytes, every: float) -> Iterator[bytes]:
        """Yield the body a byte at a time until the test ends."""
        for byte in body:
            if self.released.wait(every):
                return
            yield bytes([byte])


@contextmanager
def receiving() -> Iterator[tuple[str, Receiver]]:
    """Serve a Receiver on a free loopback port; release held answers at the end."""
    receiver = Receiver()
    with thread_server(receiver) as base_url:  # type: ignore[arg-type]
        try:
            yield base_url, receiver
        finally:
            receiver.released.set()
