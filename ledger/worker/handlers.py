"""The handler registry: which handlers one worker runs, found where its configuration says.

Handlers are declared with the public `ledger.handlers.handler`; this module
(internal) picks the ones a worker runs:

- every module named in LEDGER_HANDLER_MODULES (comma-separated import paths)
  is imported, and each contributes the handlers declared while it was being
  imported (by it, or by any module it imported), those of its submodules, and
  those it references (`import acme_lib`, `from acme_lib import mark_paid`:
  found even when another import ran the declaration first);
- every entry point of the group `replay_ledger.handlers` of the installed
  distributions (its value names a module, or `module:object`) contributes
  the same way;
- the demo handlers (ledger.demo.handlers) when LEDGER_DEMO_HANDLERS=1.

A source that cannot be imported or contributes no handler, and two handlers
for one event type, raise `RegistrationError`: `ledger worker` and `ledger dev`
stop at start with exit 2 and the message.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from types import ModuleType

from ledger.config import Settings
from ledger.errors import error_summary
from ledger.handlers import Declaration, Event, Handler, Prepare, declarations, handler

__all__ = ["DEMO_MODULE", "ENTRY_POINT_GROUP", "NO_HANDLER_RESULT", "Event", "HandlerSpec",
           "Prepare", "RegistrationError", "Registry", "handler", "load_registry"]

DEMO_MODULE = "ledger.demo.handlers"
ENTRY_POINT_GROUP = "replay_ledger.handlers"
NO_HANDLER_RESULT = "ignored:no-handler"

HandlerSpec = Declaration  # the registry's name for a declared handler


class RegistrationError(ValueError):
    """A configured handler source is missing, empty, or clashes with another."""


class Registry:
    """The handlers one worker runs, keyed by event type."""

    def __init__(self, specs: Mapping[str, HandlerSpec] | None = None) -> None:
        self._specs = dict(specs or {})

    @classmethod
    def of(cls, handlers: Mapping[str, Handler]) -> Registry:
        """Build a registry from plain functions (tests, embedding)."""
        return cls({t: HandlerSpec(event_type=t, apply=f) for t, f in handlers.items()})

    def get(self, event_type: str) -> HandlerSpec | None:
        """Return the handler of `event_type`, or None."""
        return self._specs.get(event_type)

    def types(self) -> list[str]:
        """Return the registered event types, sorted."""
        return sorted(self._specs)


def _referenced_modules(module: ModuleType) -> set[str]:
    """Return the modules a module's namespace refers to (imported modules, functions)."""
    names = set()
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            names.add(value.__name__)
        elif callable(value):
            names.add(str(getattr(value, "__module__", "") or ""))
    return names


def declared_by(name: str) -> list[HandlerSpec]:
    """Return the handlers an imported module contributes (see the module's docstring)."""
    module = sys.modules.get(name)
    referenced = _referenced_modules(module) if module is not None else set()
    return [d for d in declarations()
            if name in d.importers or d.module == name or d.module.startswith(name + ".")
            or d.module in referenced]


def _import(label: str, name: str) -> list[HandlerSpec]:
    """Import one handler source; refuse one that fails or declares nothing."""
    try:
        importlib.import_module(name)
    except Exception as error:  # any failure of the user's import stops the worker
        raise RegistrationError(f"{label}: cannot import {name!r}: "
                                f"{error_summary(error)}") from None
    found = declared_by(name)
    if not found:
        raise RegistrationError(f"{label}: {name!r} registers no handler "
                                "(no @handler was declared by it or by what it imports)")
    return found


@functools.cache
def _entry_point_modules() -> tuple[tuple[str, str], ...]:
    """Return (name, module) of the group's entry points (read once: installs need a restart)."""
    return tuple((point.name, point.module) for point in entry_points(group=ENTRY_POINT_GROUP))


def _sources(settings: Settings) -> Iterable[tuple[str, str]]:
    """Yield (what names it, module) of every handler source the configuration names."""
    for name in settings.handler_modules:
        yield "LEDGER_HANDLER_MODULES", name
    for name, module in _entry_point_modules():
        yield f"entry point {name!r} ({ENTRY_POINT_GROUP})", module
    if settings.demo_handlers:
        yield "LEDGER_DEMO_HANDLERS", DEMO_MODULE


def load_registry(settings: Settings) -> Registry:
    """Import every configured handler source and return their handlers."""
    specs: dict[str, tuple[HandlerSpec, str]] = {}
    for label, name in _sources(settings):
        for spec in _import(label, name):
            seen = specs.get(spec.event_type)
            if seen is not None and seen[0].apply is not spec.apply:
                raise RegistrationError(
                    f"event type {spec.event_type!r} has two handlers: {seen[0].name} "
                    f"(from {seen[1]}) and {spec.name} (from {label} {name!r})")
            specs[spec.event_type] = (spec, f"{label} {name!r}")
    return Registry({t: spec for t, (spec, _) in specs.items()})
