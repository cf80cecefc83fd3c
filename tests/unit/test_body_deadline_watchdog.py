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


def read_in_time(seconds: float, bodies: int, *,
                 settle: float = 0.0) -> tuple[Watchdog, CountingCondition]:
    """Read `bodies` bodies each at once, 1 ms apart, as buffered ones are; none is cut off."""
    watchdog = Watchdog(seconds=seconds)
    counting = CountingCondition(watchdog._lock)
    watchdog._wake = counting
    left, right = socket.socketpair()
    try:
        for _ in range(bodies):
            watchdog.release(watchdog.watch(left))
            time.sleep(0.001)  # the watchdog thread gets the interpreter between requests
        time.sleep(settle)
        left.send(b"x")  # the socket was never shut for reading: the reads were in time
        assert right.recv(1) == b"x"
    finally:
        left.close()
        right.close()
    return watchdog, counting


def test_bodies_read_in_time_wake_the_watchdog_once_not_per_request() -> None:
    _, counting = read_in_time(30, 200)
    assert counting.notified <= 1  # the old watchdog was woken 200 times here


def test_bodies_read_in_time_leave_together_when_the_oldest_deadline_passes() -> None:
    # Deadlines come every few milliseconds under load: the thread must not wake for each.
    bodies = 300
    watchdog, counting = read_in_time(0.05, bodies, settle=0.2)  # every deadline passed
    # About two wakes per deadline period (the drain, then the next first entry);
    # waking at each body's own deadline was one wake per body.
    assert counting.woken < bodies / 5
    with watchdog._lock:
        assert not watchdog._queue  # every finished body left the queue


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
