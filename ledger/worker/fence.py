"""The handler's connection: the completion transaction's, with its ends out of reach.

A handler that could commit would commit its effects apart from the receipt's
completion (and a retry would repeat them): exactly-once broken by one line of
user code. So the handler gets a proxy of the worker's connection that runs
statements as usual but refuses to commit, roll back, begin or close; a refusal
is remembered, so the attempt fails even if the handler catches the error.
Savepoints (`begin_nested()`) stay inside the transaction and are allowed.
"""

from __future__ import annotations

from typing import Any, NoReturn, cast

from sqlalchemy import Connection

from ledger.handlers import Event, FenceViolation, Handler
from ledger.worker.handlers import NO_HANDLER_RESULT, HandlerSpec

# result_ref is a small reference kept on the hot receipts table for the whole retention.
RESULT_REF_LIMIT = 256
# Everything that ends, replaces or leaves the worker's transaction. Savepoints
# (begin_nested) stay inside it and are allowed.
_REFUSED = frozenset({"commit", "rollback", "begin", "close", "detach", "invalidate",
                      "get_transaction", "begin_twophase"})


class FencedConnection:
    """Pass everything through to a Connection except what would end its transaction."""

    __slots__ = ("_conn", "violation")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.violation: FenceViolation | None = None

    def __getattr__(self, name: str) -> Any:
        if name in _REFUSED:
            return lambda *_args, **_kwargs: self._refuse(name)
        return getattr(self._conn, name)

    def __enter__(self) -> NoReturn:
        self._refuse("__enter__")

    def __exit__(self, *_exc: object) -> None:  # never reached: __enter__ raises
        return None

    def _refuse(self, name: str) -> NoReturn:
        """Remember and raise the violation."""
        what = "use it as a context manager (it closes it)" if name == "__enter__" else (
            f"call {name}()")
        self.violation = FenceViolation(
            f"a handler may not {what} on its connection: it belongs to the worker's "
            "completion transaction, which commits the handler's writes with the receipt")
        raise self.violation

    def check(self) -> None:
        """Raise the violation again if the handler caught it (the attempt still fails)."""
        if self.violation is not None:
            raise self.violation


def run_fenced(apply: Handler, conn: Connection, event: Event) -> str:
    """Run a handler on the fenced view of `conn`; return its checked result_ref.

    A fence violation fails it even if the handler caught it.
    """
    fence = FencedConnection(conn)
    result_ref: object = apply(cast(Connection, fence), event)
    fence.check()
    return check_result_ref(event.event_type, result_ref)


def apply_handler(spec: HandlerSpec | None, conn: Connection, event: Event) -> str:
    """Run the event's handler in the completion transaction; no handler: ignored."""
    return NO_HANDLER_RESULT if spec is None else run_fenced(spec.apply, conn, event)


def check_result_ref(event_type: str, result_ref: object) -> str:
    """Return a handler's result_ref, refusing one that is not a short non-empty str."""
    if not isinstance(result_ref, str) or not 0 < len(result_ref) <= RESULT_REF_LIMIT:
        raise TypeError(f"handler of {event_type} must return a str result_ref of "
                        f"1-{RESULT_REF_LIMIT} characters")
    return result_ref
