"""The handler registry: what a worker runs for each event type.

A handler is a function `(conn, event) -> result_ref` registered with
`@handler("invoice.paid")`. It runs inside the worker's completion
transaction: whatever it writes through `conn` commits together with the
receipt becoming `complete`, or not at all. So a handler's *local* effects
happen exactly once per (scope, event id).

A handler must not make network calls or sleep inside that transaction (it
would hold row locks across a slow call). Work that is slow or talks to
another system goes into an optional `prepare(event)` step, which the worker
runs after the claim and before the transaction opens; its return value is
handed to the handler as `event.prepared`. External effects are at-least-once:
if the worker dies after `prepare` but before the commit, the next attempt runs
`prepare` again. Pass `event.idempotency_key` ("<scope>:<event_id>") to the
remote side so that it can recognise the repeat, or reconcile on a stable
business key (README, "Workers").

User modules named in LEDGER_HANDLER_MODULES (comma-separated) are imported
by `load_registry`, which takes the handlers defined in them and their
submodules; the demo handlers (ledger.demo.handlers) only when
LEDGER_DEMO_HANDLERS=1.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from ledger.config import Settings

DEMO_MODULE = "ledger.demo.handlers"
NO_HANDLER_RESULT = "ignored:no-handler"

HandlerFunc = Callable[[Connection, "Event"], str]
PrepareFunc = Callable[["Event"], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One accepted event as a handler sees it (never logged: the payload is private)."""

    scope: str
    scope_id: int
    event_id: str
    event_type: str
    payload: dict[str, Any] = field(repr=False)
    attempt: int
    accepted_at: datetime
    prepared: Any = field(default=None, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Return the key to pass downstream: "<scope>:<event_id>"."""
        return f"{self.scope}:{self.event_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerSpec:
    """A registered handler and its optional out-of-transaction step."""

    event_type: str
    apply: HandlerFunc
    prepare: PrepareFunc | None = None

    @property
    def module(self) -> str:
        """Return the module that defined the handler."""
        return getattr(self.apply, "__module__", "")


# Handlers as declared, per defining module: a process may import modules it was
# not configured with (tests, tools); `load_registry` picks the configured ones.
_DECLARED: dict[str, dict[str, HandlerSpec]] = {}


def handler(event_type: str, *, prepare: PrepareFunc | None = None
            ) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of `event_type`."""

    def register(func: HandlerFunc) -> HandlerFunc:
        spec = HandlerSpec(event_type=event_type, apply=func, prepare=prepare)
        declared = _DECLARED.setdefault(spec.module, {})
        existing = declared.get(event_type)
        if existing is not None and existing.apply.__qualname__ != func.__qualname__:
            raise ValueError(f"event type {event_type!r} has two handlers in {spec.module}")
        declared[event_type] = spec
        return func

    return register


class Registry:
    """The handlers one worker runs, keyed by event type."""

    def __init__(self, specs: Mapping[str, HandlerSpec] | None = None) -> None:
        self._specs = dict(specs or {})

    @classmethod
    def of(cls, handlers: Mapping[str, HandlerFunc]) -> Registry:
        """Build a registry from plain functions (tests, embedding)."""
        return cls({t: HandlerSpec(event_type=t, apply=f) for t, f in handlers.items()})

    def get(self, event_type: str) -> HandlerSpec | None:
        """Return the handler of `event_type`, or None."""
        return self._specs.get(event_type)

    def types(self) -> list[str]:
        """Return the registered event types, sorted."""
        return sorted(self._specs)


def load_registry(settings: Settings) -> Registry:
    """Import the configured handler modules and return their handlers."""
    for name in settings.handler_modules:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ValueError(f"LEDGER_HANDLER_MODULES: cannot import {name!r}: {error}") from None
    wanted = [*settings.handler_modules, *([DEMO_MODULE] if settings.demo_handlers else [])]
    if settings.demo_handlers:
        importlib.import_module(DEMO_MODULE)
    specs: dict[str, HandlerSpec] = {}
    # Only handlers of the configured modules and their submodules count.
    for module, declared in _DECLARED.items():
        if not any(module == m or module.startswith(m + ".") for m in wanted):
            continue
        for event_type, spec in declared.items():
            if event_type in specs:
                raise ValueError(f"event type {event_type!r} has two handlers: "
                                 f"{specs[event_type].module} and {module}")
            specs[event_type] = spec
    return Registry(specs)
