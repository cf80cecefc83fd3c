"""GroupCommit: claims that arrive together share one write; each gets its own answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from itertools import chain

import pytest

from ledger.intake.group_commit import Failed, GroupCommit


class Store:
    """A write function that records its batches and can be held in the middle of one."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()

    def write(self, items: Sequence[str]) -> list[str | Failed]:
        self.batches.append(list(items))
        self.entered.set()
        assert self.release.wait(10)
        if "boom" in items:
            raise OSError("disk full")
        return [Failed(ValueError(item)) if item.startswith("bad") else item.upper()
                for item in items]


def _submit_all(group: GroupCommit[str, str], items: list[str]) -> dict[str, object]:
    answers: dict[str, object] = {}

    def one(item: str) -> None:
        try:
            answers[item] = group.submit(item)
        except Exception as error:
            answers[item] = error

    threads = [threading.Thread(target=one, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    answers["_threads"] = threads
    return answers


def _queued(group: GroupCommit[str, str], n: int) -> None:
    deadline = time.monotonic() + 10
    while len(group._queue) < n:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _join(answers: dict[str, object]) -> dict[str, object]:
    for thread in answers.pop("_threads"):  # type: ignore[attr-defined]
        thread.join(10)
    return answers


def test_a_claim_on_an_idle_process_is_written_alone_at_once():
    store = Store()
    group = GroupCommit(store.write, limit=64)
    assert group.submit("a") == "A"
    assert group.submit("b") == "B"
    assert store.batches == [["a"], ["b"]]


def _during_a_write(store: Store, limit: int, items: list[str]) -> dict[str, object]:
    """Submit `items` while a first claim is being written, then one more; return every
    answer."""
    group: GroupCommit[str, str] = GroupCommit(store.write, limit=limit)
    store.release.clear()
    first = _submit_all(group, ["first"])
    assert store.entered.wait(10)
    rest = _submit_all(group, items)
    _queued(group, len(items))
    store.release.set()
    answers = _join(first) | _join(rest)
    answers["after"] = group.submit("after")  # and the process takes claims after it
    return answers


def test_claims_that_arrive_during_a_write_share_the_next_one_up_to_the_limit():
    store = Store()
    answers = _during_a_write(store, 3, [f"e{n}" for n in range(5)])
    assert answers == {"first": "FIRST", "after": "AFTER"} | {f"e{n}": f"E{n}" for n in range(5)}
    assert [len(b) for b in store.batches] == [1, 3, 2, 1]
    assert sorted(chain.from_iterable(store.batches[1:3])) == [f"e{n}" for n in range(5)]


def test_one_claims_own_error_is_answered_to_it_alone():
    store = Store()
    answers = _during_a_write(store, 64, ["ok1", "bad", "ok2"])
    assert [len(b) for b in store.batches] == [1, 3, 1]
    assert (answers["ok1"], answers["ok2"], answers["first"]) == ("OK1", "OK2", "FIRST")
    assert isinstance(answers["bad"], ValueError)


def test_a_failed_transaction_fails_every_claim_in_it_and_the_next_batch_still_runs():
    store = Store()
    answers = _during_a_write(store, 64, ["x", "boom", "y"])
    assert answers["first"] == "FIRST"
    assert all(isinstance(answers[k], OSError) for k in ("x", "boom", "y"))
    assert answers["after"] == "AFTER"
    assert store.batches[-1] == ["after"]


def test_the_batch_is_taken_once_the_gate_lets_the_leader_in():
    """Claims that queue while the leader waits for its turn ride in its transaction."""
    store = Store()
    turn = threading.Lock()
    turn.acquire()
    group: GroupCommit[str, str] = GroupCommit(store.write, limit=64, gate=lambda: turn)
    first = _submit_all(group, ["a"])
    _queued(group, 1)
    rest = _submit_all(group, ["b", "c"])
    _queued(group, 3)
    turn.release()
    assert _join(first) | _join(rest) == {"a": "A", "b": "B", "c": "C"}
    assert store.batches == [["a", "b", "c"]]


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(Store().write, limit=0)
