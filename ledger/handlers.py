"""Write the code that runs for each accepted event: the public handler API.

A handler is a function `(conn, event) -> result_ref` declared with
`@handler("invoice.paid")`::

    from sqlalchemy import Connection, text

    from ledger.handlers import Event, PermanentFailure, RetryAfter, handler

    @handler("invoice.paid")
    def mark_paid(conn: Connection, event: Event) -> str:
        invoice = event.payload["data"]["invoice"]
        if not isinstance(invoice, str):
            raise PermanentFailure("data.invoice must be a string")  # never retried
        conn.execute(text("UPDATE invoices SET paid = true WHERE id = :id"), {"id": invoice})
        return f"invoice:{invoice}"

It runs inside the worker's completion transaction: whatever it writes through
`conn` commits together with the receipt becoming `complete`, or not at all,
so its *local* effects happen exactly once per (scope, event id). `conn`
belongs to that transaction (the fence): `commit()`, `rollback()`, `begin()`
and `close()` on it raise `FenceViolation`, and the attempt fails.

A handler must not make network calls or sleep (it would hold row locks across
a slow call). Such work goes into an optional `prepare(event)` step, run with
no transaction open; its return value reaches the handler as `event.prepared`.
External effects are at-least-once: pass `event.idempotency_key` downstream.

Any exception is retried with backoff up to LEDGER_MAX_ATTEMPTS; raise
`PermanentFailure(reason)` to fail the receipt at once, or `RetryAfter(seconds)`
to try again no sooner than that. Which modules are searched for handlers is
described in docs/how-to/handlers.md ("Registering").
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection

__all__ = [
    "Event",
    "FenceViolation",
    "Handler",
    "PermanentFailure",
    "Prepare",
    "RetryAfter",
    "handler",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One accepted event as a handler sees it (never logged: the payload is private)."""

    scope: str  # "<account>/<integration>"
    scope_id: int  # the scope's numeric id: a compact key for the handler's own rows
    event_id: str
    event_type: str
    payload: dict[str, Any] = field(repr=False)  # the parsed JSON body
    attempt: int  # 1 for the first attempt; counts every attempt of the receipt
    accepted_at: datetime  # when the ledger accepted the delivery (UTC)
    prepared: Any = field(default=None, repr=False)  # what the handler's prepare returned

    @property
    def idempotency_key(self) -> str:
        """Return the key to pass downstream: "<scope>:<event_id>"."""
        return f"{self.scope}:{self.event_id}"


class Handler(Protocol):
    """What `@handler` decorates: run in the completion transaction, return a result_ref."""

    def __call__(self, conn: Connection, event: Event, /) -> str:
        """Apply the event's local effects through `conn`; return a short result_ref."""
        ...


class Prepare(Protocol):
    """An optional step run before the transaction opens; its result is `event.prepared`."""

    def __call__(self, event: Event, /) -> Any:
        """Do the slow or remote part of the work (no transaction is open)."""
        ...


class PermanentFailure(Exception):
    """Raise to fail the receipt at once: no retry, `last_error` is the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryAfter(Exception):
    """Raise to try the event again no sooner than `seconds` from now (the attempt counts)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"RetryAfter needs a finite number of seconds >= 0, not {seconds!r}")
        super().__init__(reason or f"retry after {seconds:g}s")
        self.seconds = float(seconds)
        self.reason = reason


class FenceViolation(RuntimeError):
    """A handler tried to end, begin or close the transaction it was given."""


H = TypeVar("H", bound=Callable[..., str])


@dataclass(frozen=True, slots=True, kw_only=True)
class Declaration:
    """A handler as `@handler` declared it, and the modules being imported at the time."""

    event_type: str
    apply: Handler
    prepare: Prepare | None = None
    importers: frozenset[str] = frozenset()  # modules whose import ran the declaration

    @property
    def module(self) -> str:
        """Return the module that defined the handler."""
        return getattr(self.apply, "__module__", "") or ""

    @property
    def name(self) -> str:
        """Return `module.qualname` of the handler (for messages)."""
        return f"{self.module}.{getattr(self.apply, '__qualname__', '?')}"


# Every declaration of this process, in order. The worker's registry picks the ones
# its configuration names (ledger.worker.handlers.load_registry).
_DECLARED: list[Declaration] = []


def _importing_modules() -> frozenset[str]:
    """Return the modules whose top-level code is running now (the import chain)."""
    names = set()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            names.add(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back  # type: ignore[assignment]
    return frozenset(names)


def handler(event_type: str, *, prepare: Prepare | None = None) -> Callable[[H], H]:
    """Declare the decorated function as the handler of `event_type`."""
    if not isinstance(event_type, str) or not event_type:
        raise ValueError("handler() needs a non-empty event type")

    def declare(func: H) -> H:
        declaration = Declaration(event_type=event_type, apply=func, prepare=prepare,
                                  importers=_importing_modules())
        # A module imported again (importlib.reload) replaces its own declaration.
        _DECLARED[:] = [d for d in _DECLARED if d.name != declaration.name
                        or d.event_type != event_type]
        _DECLARED.append(declaration)
        return func

    return declare


def declarations() -> tuple[Declaration, ...]:
    """Return every handler declared in this process so far (internal: the registry's)."""
    return tuple(_DECLARED)
