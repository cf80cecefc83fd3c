"""A small load generator for fault tests: signed deliveries from a few threads, every
answer recorded, and a redelivery pass that retries whatever was not acknowledged."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests

from tests.helpers import Sender, event_body, signed_headers

REQUEST_TIMEOUT = 15.0  # seconds: a request still open after this counts as hung


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """What one delivery got back (status None: the connection failed or timed out)."""

    event_id: str
    status: int | None
    seconds: float
    retry_after: str | None
    body: object
    error: str | None = None


def post_delivery(session: requests.Session, base_url: str, sender: Sender,
                  event_id: str) -> Answer:
    """Sign and send one demo.credit delivery; never raise."""
    body = event_body(sender.profile, event_id, data={"amount": 1})
    started = time.monotonic()
    try:
        response = session.post(f"{base_url}/hooks/{sender.public_id}", data=body,
                                headers=signed_headers(sender, body, event_id),
                                timeout=REQUEST_TIMEOUT)
    except requests.RequestException as error:
        return Answer(event_id=event_id, status=None, seconds=time.monotonic() - started,
                      retry_after=None, body=None, error=type(error).__name__)
    try:
        parsed: object = response.json()
    except ValueError:
        parsed = response.text[:200]
    return Answer(event_id=event_id, status=response.status_code,
                  seconds=time.monotonic() - started,
                  retry_after=response.headers.get("Retry-After"), body=parsed)


class LoadGenerator:
    """Send fresh events from `threads` threads until stopped."""

    def __init__(self, base_url: str, sender: Sender, *, prefix: str, threads: int = 4,
                 pause: float = 0.005) -> None:
        self.base_url = base_url
        self.sender = sender
        self.prefix = prefix
        self.pause = pause
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    def start(self) -> LoadGenerator:
        """Start sending."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Answer]:
        """Stop sending and return every answer."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT + 5)
        return list(self.answers)

    def acknowledged(self) -> int:
        """Return how many deliveries got a 2xx so far."""
        with self._lock:
            return sum(1 for a in self.answers if a.status is not None and a.status < 300)

    def wait_for(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        """Wait (bounded) until `predicate(answers)` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(self.answers):
                    return
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def _run(self, index: int) -> None:
        """Send events named prefix-index-n until stopped."""
        session = requests.Session()
        n = 0
        while not self._stop.is_set():
            answer = post_delivery(session, self.base_url, self.sender,
                                   f"{self.prefix}-{index}-{n}")
            if answer.status is None:
                session = requests.Session()  # a broken connection is not reused
            with self._lock:
                self.answers.append(answer)
            n += 1
            time.sleep(self.pause)


def redeliver_until_acknowledged(base_url: str, sender: Sender, event_ids: list[str], *,
                                 timeout: float = 60.0) -> dict[str, int]:
    """Send each event again until it gets a 2xx; return its final status."""
    session = requests.Session()
    final: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    for event_id in event_ids:
        while True:
            answer = post_delivery(session, base_url, sender, event_id)
            if answer.status is not None and answer.status < 300:
                final[event_id] = answer.status
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{event_id} never acknowledged: {answer}")
            time.sleep(0.2)
    return final
