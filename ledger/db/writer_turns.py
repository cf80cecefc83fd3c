"""Writer turns on SQLite: every write transaction of every ledger process queues in one line.

SQLite has one writer at a time. A transaction that finds the write lock taken sleeps
in SQLite's busy handler (1, 2, 5, 10 ... 100 ms) and retries, so a process that
commits and begins again at once wins the lock over writers that are asleep: a
worker draining a backlog would leave the intake's claims waiting up to seconds. Here each
transaction first takes its turn
through an advisory lock (`flock`) on a file beside the database, which the kernel
hands to the next waiter as soon as it is released; `BEGIN IMMEDIATE` then finds the
database free.

- Every turn opens the file for itself, so the threads of one process queue like
  processes do (one descriptor per process would let them all in at once, and so
  would one inherited through fork). A thread's turn is reentrant: a transaction
  opened while the same thread holds the turn does not wait for itself.
- The turn decides only who goes next; SQLite's own lock still excludes writers.
  A turn held longer than `max_hold` (a hung handler, a long migration) is released
  by a watchdog thread, and the writers behind it meet SQLite's busy timeout as
  they would with no turns at all, so a stuck transaction still ends in "database
  is locked" errors after `busy_timeout`, never in a wait without end.
- A holder whose whole process does not run (stopped by SIGSTOP or a terminal's
  Ctrl-Z, frozen by a container pause) cannot run its watchdog either. So no thread
  waits in the kernel's line itself: this process's line thread (`_Line`) waits there
  for it, and a writer that is not let in within `max_wait` goes on without its turn,
  to SQLite's busy timeout. While that wait stays stuck, the process's next writers go
  on at once, without waiting again (`ledger_sqlite_writer_turns_skipped_total`).
- The lock goes with its process: a killed writer never leaves it held. The file
  holds no data and is safe to delete while nothing runs.
- Each turn reports how long it waited and how long it was held
  (`ledger_sqlite_writer_wait_seconds`, `ledger_sqlite_writer_held_seconds`): the turns are
  exclusive, so the held time's rate is the share of the time the one writer was busy.
"""

from __future__ import annotations

import fcntl
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ledger.metrics import SQLITE_WRITER_HELD, SQLITE_WRITER_SKIPPED, SQLITE_WRITER_WAIT

MAX_HOLD_SECONDS = 1.0  # a turn held longer is released by the watchdog
# A writer waits this long for its turn, then goes on without it: a live holder's watchdog
# lets the line move within MAX_HOLD_SECONDS + WATCH_EVERY, so a longer wait means a holder
# whose process does not run.
MAX_WAIT_SECONDS = 2.0
WATCH_EVERY = 0.25  # seconds between two looks of the watchdog


def turns_path(database: str) -> str:
    """Return the lock file of the SQLite database at `database`."""
    return f"{database}-writer.lock"


class _Holder:
    """One thread's hold: its open file on the lock (-1 between turns) and reentrant count."""

    __slots__ = ("count", "deadline", "fd", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.count = 0
        self.fd = -1
        self.deadline = 0.0


# Guards the holds the watchdog looks at; one watchdog thread per process.
_GUARD = threading.Lock()
_HELD: set[_Holder] = set()
_WATCHDOG_PID = 0


class WriterTurns:
    """One line of writers across processes and threads, through `flock` on `path`.

    A turn opens the file, locks it, and closes it when it ends: each turn has an
    open file of its own, so no two threads or processes (forked or not) share one.
    """

    def __init__(self, path: str, max_hold: float = MAX_HOLD_SECONDS,
                 max_wait: float = MAX_WAIT_SECONDS) -> None:
        self.path = path
        self.max_hold = max_hold
        self.max_wait = max_wait
        self._local = threading.local()

    def acquire(self) -> _Holder:
        """Wait for this thread's turn (or count one more if it holds it); return the holder.

        A writer not let in within `max_wait` goes on without its turn: the holder holds no
        file, and the transaction meets SQLite's own lock and busy timeout.
        """
        holder: _Holder | None = getattr(self._local, "holder", None)
        if holder is None or holder.pid != os.getpid():  # new thread, or a forked child
            holder = self._local.holder = _Holder()
        if holder.count == 0:
            asked = time.monotonic()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                granted = time.monotonic()
            except BlockingIOError:
                granted = _line().wait(fd, self.max_wait)
                if not granted:  # the line thread has fd now
                    SQLITE_WRITER_SKIPPED.inc()
                    holder.count += 1
                    return holder
            except BaseException:
                os.close(fd)
                raise
            with _GUARD:
                _watch_this_process()
                holder.fd, holder.deadline = fd, granted + self.max_hold
                _HELD.add(holder)
            SQLITE_WRITER_WAIT.observe(granted - asked)  # a new turn, not a reentrant hold
        holder.count += 1
        return holder

    def release(self, holder: _Holder) -> None:
        """End one hold of `holder`; the last one passes the turn on."""
        holder.count -= 1
        if holder.count == 0:
            with _GUARD:
                _HELD.discard(holder)
                fd, holder.fd = holder.fd, -1
            if fd >= 0:
                # The turn came max_hold before its deadline; it ends at the unlock, after
                # which the next writer's turn may already have begun.
                held = time.monotonic() - holder.deadline + self.max_hold
                # Unlock first: a child forked during the turn shares this open file,
                # and closing ours alone would leave the lock held.
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                SQLITE_WRITER_HELD.observe(held)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the turn for the `with` block."""
        holder = self.acquire()
        try:
            yield
        finally:
            self.release(holder)


class _Ask:
    """One writer's ask for its turn, waited for by the line thread."""

    __slots__ = ("answered", "fd", "gone", "granted", "guard")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.guard = threading.Lock()
        self.answered = threading.Lock()  # held until the line thread answers
        self.answered.acquire()
        self.granted = 0.0  # when the kernel let this ask in (monotonic), 0 if not (yet)
        self.gone = False  # the writer stopped waiting: the line thread closes fd


class _Line:
    """The thread of this process that waits in the kernel's line for its writers' turns.

    A thread blocked in `flock` cannot stop waiting; this one can be left waiting. It
    takes the asks one by one, as the threads of a process queue like processes do.
    """

    def __init__(self) -> None:
        self._asks: queue.SimpleQueue[_Ask] = queue.SimpleQueue()
        self._current: _Ask | None = None  # the ask waiting in the kernel's line now
        threading.Thread(target=self._run, daemon=True, name="ledger-writer-line").start()

    def wait(self, fd: int, timeout: float) -> float:
        """Wait up to `timeout` for the turn on `fd`; return when the kernel let it in.

        0.0: not let in, and `fd` is the line thread's to close.
        """
        current = self._current
        if current is not None and current.gone:  # stuck behind a holder that does not run
            os.close(fd)
            return 0.0
        ask = _Ask(fd)
        self._asks.put(ask)
        try:
            ask.answered.acquire(timeout=timeout)
        except BaseException:  # interrupted: a turn let in meanwhile is given back
            with ask.guard:
                ask.gone = True
                granted = ask.granted
            if granted:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            raise
        with ask.guard:
            ask.gone = not ask.granted
            return ask.granted

    def _run(self) -> None:
        while True:
            ask = self._current = self._asks.get()
            try:
                fcntl.flock(ask.fd, fcntl.LOCK_EX)
            except OSError:  # the writer goes on without the turn
                with ask.guard:
                    ask.gone = True
                os.close(ask.fd)
                ask.answered.release()
                continue
            finally:
                self._current = None
            granted = time.monotonic()
            with ask.guard:
                if not ask.gone:
                    ask.granted = granted
            if ask.granted:
                ask.answered.release()
            else:
                fcntl.flock(ask.fd, fcntl.LOCK_UN)
                os.close(ask.fd)


_LINE: _Line | None = None
_LINE_PID = 0


def _line() -> _Line:
    """Return this process's line thread, started on first use (and again after a fork)."""
    global _LINE, _LINE_PID
    with _GUARD:
        if _LINE is None or os.getpid() != _LINE_PID:
            _LINE, _LINE_PID = _Line(), os.getpid()
        return _LINE


def _watch_this_process() -> None:
    """Start this process's watchdog unless it runs (called under `_GUARD`)."""
    global _WATCHDOG_PID
    if os.getpid() != _WATCHDOG_PID:
        _WATCHDOG_PID = os.getpid()
        threading.Thread(target=_watch, daemon=True, name="ledger-writer-turns").start()


def _watch() -> None:
    """Every WATCH_EVERY seconds, release the turns held past their `max_hold`."""
    while True:
        time.sleep(WATCH_EVERY)
        with _GUARD:
            now = time.monotonic()
            for holder in [h for h in _HELD if h.deadline < now]:
                _HELD.discard(holder)
                fcntl.flock(holder.fd, fcntl.LOCK_UN)  # the file stays open until release


def _after_fork_in_child() -> None:
    """A forked child has no watchdog, and must not inherit a guard held at the fork.

    The files of the turns held at the fork are the parent's: the child closes its
    copies without unlocking them (that would end the parent's turn).
    """
    global _GUARD, _HELD, _WATCHDOG_PID
    for holder in _HELD:
        with suppress(OSError):
            os.close(holder.fd)
        holder.fd = -1  # a release in the child then touches no file (the number may be reused)
    _GUARD, _HELD, _WATCHDOG_PID = threading.Lock(), set(), 0


os.register_at_fork(after_in_child=_after_fork_in_child)

_REGISTRY: dict[str, WriterTurns] = {}
_REGISTRY_GUARD = threading.Lock()


def writer_turns(database: str) -> WriterTurns:
    """Return this process's turns of the SQLite file `database` (one per file)."""
    path = turns_path(os.path.abspath(database))
    with _REGISTRY_GUARD:
        turns = _REGISTRY.get(path)
        if turns is None:
            turns = _REGISTRY[path] = WriterTurns(path)
        return turns


class TurnTakingConnection(sqlite3.Connection):
    """A sqlite3 connection whose transaction holds its writer turn until it ends.

    `take_turn` is called before `BEGIN IMMEDIATE` (the engine's begin event); the
    turn is given back once `commit`, `rollback` or `close` has returned. The class
    is subclassed per database with its `turns` (`connection_factory`).
    """

    turns: WriterTurns

    def take_turn(self) -> None:
        """Wait for this connection's turn to write (idempotent within a transaction)."""
        if getattr(self, "_turn", None) is None:
            self._turn: _Holder | None = self.turns.acquire()

    def end_turn(self) -> None:
        """Give the turn back, if this connection holds it."""
        holder = getattr(self, "_turn", None)
        if holder is not None:
            self._turn = None
            self.turns.release(holder)

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.end_turn()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.end_turn()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.end_turn()


def connection_factory(database: str) -> type[TurnTakingConnection]:
    """Return the sqlite3 connection class whose transactions take turns on `database`."""
    attributes: dict[str, Any] = {"turns": writer_turns(database)}
    return type("TurnTakingConnection", (TurnTakingConnection,), attributes)
