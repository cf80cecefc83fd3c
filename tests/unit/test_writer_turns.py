"""Writer turns (ledger.db.writer_turns): one line of SQLite writers, threads and processes."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.db.writer_turns import WriterTurns


def _taken(path: Path) -> bool:
    """Tell whether someone holds the turn, asking through a file of our own."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing our own file ends our own test lock
    return False


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3-writer.lock"


def test_two_threads_of_one_process_take_turns(lock_path: Path):
    turns = WriterTurns(str(lock_path))
    entered = threading.Event()

    def second() -> None:
        with turns.held():
            entered.set()

    with turns.held():
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.3)  # one open file per thread: the second waits
    assert entered.wait(5)
    thread.join(5)
    assert not _taken(lock_path)


def test_a_thread_holding_its_turn_does_not_wait_for_itself(lock_path: Path):
    turns = WriterTurns(str(lock_path))
    outer = turns.acquire()
    inner = turns.acquire()  # a second transaction of the same thread
    turns.release(inner)
    assert _taken(lock_path)  # the outer hold still keeps the turn
    turns.release(outer)
    assert not _taken(lock_path)


def test_a_turn_held_past_its_bound_is_released_for_the_others(lock_path: Path):
    turns = WriterTurns(str(lock_path), max_hold=0.3)
    holder = turns.acquire()
    assert _taken(lock_path)
    deadline = time.monotonic() + 5
    while _taken(lock_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    # The watchdog let the others in while the stuck holder still "holds" its turn;
    # SQLite's own lock and busy timeout then decide, as with no turns at all.
    assert not _taken(lock_path)
    turns.release(holder)
    with turns.held():  # the stuck thread takes turns again afterwards
        assert _taken(lock_path)


def _hold_and_report(turns: WriterTurns, times: multiprocessing.Queue) -> None:
    with turns.held():
        times.put(time.monotonic())


def test_a_forked_process_waits_for_the_turn_its_parent_holds(lock_path: Path):
    turns = WriterTurns(str(lock_path))
    fork = multiprocessing.get_context("fork")
    times: multiprocessing.Queue = fork.Queue()
    with turns.held():  # held across the fork, as a preloaded app's master might
        child = fork.Process(target=_hold_and_report, args=(turns, times))
        child.start()
        time.sleep(0.5)
        released = time.monotonic()
    child.join(10)
    assert child.exitcode == 0
    assert times.get(timeout=5) >= released


def _sleep_and_exit(seconds: float) -> None:
    time.sleep(seconds)


def test_a_child_forked_during_a_turn_does_not_keep_it(lock_path: Path):
    turns = WriterTurns(str(lock_path))
    fork = multiprocessing.get_context("fork")
    with turns.held():
        child = fork.Process(target=_sleep_and_exit, args=(3,))  # shares the open file
        child.start()
    try:
        assert not _taken(lock_path)  # released although the child still has a copy
    finally:
        child.join(10)


def _end_inherited_turn(turns: WriterTurns, holder: Any, number: int, path: str,
                        report: multiprocessing.Queue) -> None:
    # The child closed its copy of the parent's lock file; its number is free again, and
    # here another file of the child's takes it.
    os.dup2(os.open(path, os.O_RDONLY), number)
    turns.release(holder)  # an inherited connection ending its transaction in the child
    try:
        os.fstat(number)
        report.put("open")
    except OSError:
        report.put("closed")


def test_a_child_ending_a_turn_it_inherited_leaves_the_parents_and_its_own_files(
        lock_path: Path, tmp_path: Path):
    turns = WriterTurns(str(lock_path))
    other = tmp_path / "other"
    other.write_text("x")
    fork = multiprocessing.get_context("fork")
    report: multiprocessing.Queue = fork.Queue()
    holder = turns.acquire()
    try:
        child = fork.Process(target=_end_inherited_turn,
                             args=(turns, holder, holder.fd, str(other), report))
        child.start()
        child.join(10)
        assert child.exitcode == 0
        assert report.get(timeout=5) == "open"
        assert _taken(lock_path)  # still the parent's turn
    finally:
        turns.release(holder)
    assert not _taken(lock_path)


def test_a_killed_holder_leaves_the_turn_free(lock_path: Path):
    fork = multiprocessing.get_context("fork")
    times: multiprocessing.Queue = fork.Queue()
    child = fork.Process(target=_hold_forever, args=(str(lock_path), times))
    child.start()
    times.get(timeout=10)
    assert _taken(lock_path)
    child.kill()
    child.join(10)
    assert not _taken(lock_path)


def _hold_forever(path: str, times: multiprocessing.Queue) -> None:
    turns = WriterTurns(path, max_hold=3600)
    turns.acquire()
    times.put(time.monotonic())
    time.sleep(3600)


def _histogram(name: str) -> tuple[float, float]:
    """Return (count, sum) of one of the writer's histograms in this process."""
    from prometheus_client import REGISTRY

    return (REGISTRY.get_sample_value(f"{name}_count") or 0.0,
            REGISTRY.get_sample_value(f"{name}_sum") or 0.0)


def test_each_turn_reports_its_wait_and_its_hold_once(lock_path: Path):
    """On-call reads the one writer's busy share from the held time, its queue from the waits."""
    turns = WriterTurns(str(lock_path))
    held_before = _histogram("ledger_sqlite_writer_held_seconds")
    wait_before = _histogram("ledger_sqlite_writer_wait_seconds")
    waited = threading.Event()

    def second() -> None:
        with turns.held():
            waited.set()

    with turns.held():
        inner = turns.acquire()  # reentrant: the same turn, not a second one
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.2)
        turns.release(inner)
    assert waited.wait(5)
    thread.join(5)
    held = _histogram("ledger_sqlite_writer_held_seconds")
    wait = _histogram("ledger_sqlite_writer_wait_seconds")
    assert held[0] - held_before[0] == 2  # the first turn and the second thread's
    assert wait[0] - wait_before[0] == 2
    assert held[1] - held_before[1] >= 0.2  # the first turn lasted the sleep
    assert 0.15 <= wait[1] - wait_before[1] < 5  # the second thread waited for it


def _hold_then_stop(path: str, holding: Any) -> None:
    turns = WriterTurns(path)  # the default bound: its watchdog would release it in a second
    turns.acquire()
    holding.set()  # written at once (a queue's feeder thread would stop with the process)
    os.kill(os.getpid(), signal.SIGSTOP)  # Ctrl-Z, a container pause: no watchdog runs
    time.sleep(3600)


def _skipped() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("ledger_sqlite_writer_turns_skipped_total") or 0.0


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the holder did not stop"
        time.sleep(0.01)


def test_a_holder_whose_process_is_stopped_holds_the_others_only_until_their_bound(
        lock_path: Path):
    fork = multiprocessing.get_context("fork")
    holding = fork.Event()
    child = fork.Process(target=_hold_then_stop, args=(str(lock_path), holding))
    child.start()
    try:
        assert holding.wait(10)
        _wait_stopped(child.pid)
        turns = WriterTurns(str(lock_path), max_wait=0.5)
        skipped = _skipped()
        asked = time.monotonic()
        first = turns.acquire()  # waits its bound, then goes on without a turn
        waited = time.monotonic() - asked
        turns.release(first)
        assert 0.4 <= waited < 3
        assert _taken(lock_path)  # still the stopped process's
        asked = time.monotonic()
        with turns.held():  # the line is stuck: the next writer does not wait again
            assert time.monotonic() - asked < 0.3
        assert _skipped() - skipped == 2

        os.kill(child.pid, signal.SIGCONT)  # its watchdog runs again and lets the line move
        deadline = time.monotonic() + 10
        while _taken(lock_path):
            assert time.monotonic() < deadline, "the continued holder kept its turn"
            time.sleep(0.05)
        with turns.held():  # a real turn again, as the writers behind it see
            assert _taken(lock_path)
        assert _skipped() - skipped == 2
    finally:
        child.kill()
        child.join(10)
    assert not _taken(lock_path)


def test_a_writer_waiting_behind_a_live_holder_gets_its_turn_not_a_skip(lock_path: Path):
    turns = WriterTurns(str(lock_path), max_wait=5)
    skipped = _skipped()
    got = threading.Event()

    def second() -> None:
        with turns.held():
            assert _taken(lock_path)
            got.set()

    with turns.held():
        thread = threading.Thread(target=second)
        thread.start()
        assert not got.wait(0.3)
    assert got.wait(5)
    thread.join(5)
    assert _skipped() == skipped
