"""The body deadline's watchdog: bodies read in time never wake its thread one by one."""

from __future__ import annotations

import socket
import threading
import time

from ledger.web.body_deadline import Watchdog


class CountingCondition(threading.Condition):
    """A Condition that counts how often its waiter is woken by notify(), and woken at all."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.notified = 0
        self.woken = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        self.woken += 1
        return woken


def test_bodies_read_in_time_wake_the_watchdog_once_not_per_request() -> None:
    watchdog = Watchdog(seconds=30)
    counting = CountingCondition(watchdog._lock)
    watchdog._wake = counting
    left, right = socket.socketpair()
    try:
        for _ in range(200):  # each body read at once, as a buffered one is
            watchdog.release(watchdog.watch(left))
            time.sleep(0.001)  # the watchdog thread gets the interpreter between requests
        assert counting.notified <= 1  # the old watchdog was woken 200 times here
        left.send(b"x")  # the socket was never shut for reading: the reads were in time
        assert right.recv(1) == b"x"
    finally:
        left.close()
        right.close()


def test_bodies_read_in_time_leave_together_when_the_oldest_deadline_passes() -> None:
    # Deadlines come every few milliseconds under load: the thread must not wake for each.
    watchdog = Watchdog(seconds=0.05)
    counting = CountingCondition(watchdog._lock)
    watchdog._wake = counting
    left, right = socket.socketpair()
    try:
        bodies = 300
        for _ in range(bodies):  # each body read at once, as a buffered one is
            watchdog.release(watchdog.watch(left))
            time.sleep(0.001)
        time.sleep(0.2)  # every deadline has passed
        # About two wakes per deadline period (the drain, then the next first entry);
        # waking at each body's own deadline was one wake per body.
        assert counting.woken < bodies / 5
        with watchdog._lock:
            assert not watchdog._queue  # every finished body left the queue
        left.send(b"x")  # never shut for reading: every read was in time
        assert right.recv(1) == b"x"
    finally:
        left.close()
        right.close()


def test_a_body_past_its_deadline_is_still_cut_off() -> None:
    watchdog = Watchdog(seconds=0.2)
    left, right = socket.socketpair()
    try:
        for _ in range(5):
            watchdog.release(watchdog.watch(right))
        late = watchdog.watch(left)
        deadline = time.monotonic() + 5
        while not late.expired and time.monotonic() < deadline:
            time.sleep(0.02)
        assert late.expired
        assert left.recv(1) == b""  # shut for reading: the blocked read returns at once
    finally:
        left.close()
        right.close()
