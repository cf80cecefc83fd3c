"""Group commit: the claims that reach one process together share one transaction.

On SQLite every claim takes the database's one write lock (`BEGIN IMMEDIATE`) and
pays one commit (a WAL fsync at `synchronous=FULL`). The request threads of every
web process queue for that lock one by one, and a writer that finds it taken
sleeps in SQLite's busy handler (1, 2, 5, 10 ... ms) instead of waking when it is
free: under load a quarter of a 2-core machine would sit idle.

Here the claims that arrive while another is being written wait in a queue; the
thread that finds no writer becomes the leader, takes everything queued (up to
`limit`), writes it in one transaction and hands each waiter its own answer. Nobody
waits on purpose: a claim that arrives on an idle process is written at once, alone.

The leaders of the web processes take turns (`gate`: the database's writer turns,
`ledger.db.writer_turns`, an advisory lock on a file beside the database that the
kernel hands to the next waiter as soon as it is released, and that every other
SQLite transaction of the ledger takes too); the batch is taken only once the turn
has come, so it holds whatever queued meanwhile.

Each waiter is answered only after the transaction that holds its claim committed,
so a 202 still means "durably recorded". An error of one claim is its own (the
batch function answers it alone, with a savepoint); an error of the whole
transaction (the lock not granted in time, the disk) is every waiter's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class Failed:
    """A claim's own error, answered to its waiter alone."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Waiter(Generic[In]):
    __slots__ = ("answer", "item", "lead", "ready")

    def __init__(self, item: In) -> None:
        self.item = item
        self.ready = threading.Event()
        self.lead = False
        self.answer: object = None


class GroupCommit(Generic[In, Out]):
    """Run `write(items)` for whatever callers of `submit` arrived together.

    `write` returns one answer per item, in order: the item's result, or a
    `Failed` holding that item's own error. An exception raised by `write`
    fails every item of the batch.
    """

    def __init__(self, write: Callable[[Sequence[In]], list[Out | Failed]], limit: int,
                 gate: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        if limit < 1:
            raise ValueError("a group commit needs a limit of at least 1")
        self._write = write
        self._gate = gate
        self._limit = limit
        self._lock = threading.Lock()
        self._queue: list[_Waiter[In]] = []
        self._writing = False

    def submit(self, item: In) -> Out:
        """Return `item`'s answer once the transaction that wrote it has committed."""
        waiter = _Waiter(item)
        with self._lock:
            self._queue.append(waiter)
            lead = not self._writing
            self._writing = True
        if not lead:
            waiter.ready.wait()
            if not waiter.lead:
                return self._answer(waiter)
        self._lead()
        return self._answer(waiter)

    def _lead(self) -> None:
        """Write one batch (this thread's own item first), then pass the lead on."""
        batch: list[_Waiter[In]] = []
        try:
            with self._gate():
                with self._lock:
                    batch, self._queue = self._queue[:self._limit], self._queue[self._limit:]
                answers: list[object] = list(self._write([w.item for w in batch]))
            if len(answers) != len(batch):
                raise RuntimeError("a group commit answered the wrong number of claims")
        except BaseException as error:  # every waiter of the batch gets it, then it is handled
            if not batch:
                with self._lock:
                    batch, self._queue = self._queue[:self._limit], self._queue[self._limit:]
            answers = [Failed(error)] * len(batch)
        with self._lock:
            following = self._queue[0] if self._queue else None
            if following is None:
                self._writing = False
        for waiter, answer in zip(batch, answers, strict=True):
            waiter.answer = answer
            if waiter is not batch[0]:
                waiter.ready.set()
        if following is not None:
            following.lead = True
            following.ready.set()

    @staticmethod
    def _answer(waiter: _Waiter[In]) -> Out:
        answer = waiter.answer
        if isinstance(answer, Failed):
            raise answer.error
        return answer  # type: ignore[return-value]  # write's own result for this item
