"""The one input boundary of the Flask routes: text no page or store can hold is refused.

A NUL reaches PostgreSQL as a `DataError`, a lone surrogate fails the UTF-8 encoder
of every page that shows it, a CR or LF in a path or query ends up in a header or a
log line, and an integer wider than the ids' column overflows the driver. Each was a
500 somewhere; they are refused here, once, with 400, before any route or store runs.
The intake (`/hooks/`) is not behind this guard: it refuses its own input (400
`invalid_event`) by the rules of CONTRACT section 2.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from flask import Flask, Response, abort, jsonify, request
from werkzeug.routing import IntegerConverter

from ledger.web.errors import wants_json

# C0 controls and DEL; a form value may still carry TAB, LF and CR (a textarea's lines).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FORM_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Ids in paths are INTEGER columns (32-bit on PostgreSQL).
MAX_PATH_INT = 2**31 - 1
INTAKE_PREFIX = "/hooks/"
UNSAFE_DETAIL = "a path, query or form value holds a control character or a lone surrogate"


class BoundedIntConverter(IntegerConverter):
    """`<int:…>` that matches only what an id column can hold (a larger one is a 404)."""

    def __init__(self, map: object, *args: object, **kwargs: object) -> None:
        """Default the upper bound to the id columns' range."""
        kwargs.setdefault("max", MAX_PATH_INT)
        super().__init__(map, *args, **kwargs)  # type: ignore[arg-type]


def is_unsafe_text(value: str, *, multiline: bool = False) -> bool:
    """Tell whether `value` holds a control character or a lone surrogate."""
    controls = _FORM_CONTROL if multiline else _CONTROL
    return bool(controls.search(value) or _SURROGATE.search(value))


def _any_unsafe(values: Iterable[str], *, multiline: bool = False) -> bool:
    """Tell whether any of `values` is unsafe text."""
    return any(is_unsafe_text(v, multiline=multiline) for v in values)


def _has_unsafe_input() -> bool:
    """Tell whether the path, a query argument or a form field is unsafe text."""
    query = request.args
    if (is_unsafe_text(request.path) or _any_unsafe(query.keys())
            or _any_unsafe(v for vs in query.listvalues() for v in vs)):
        return True
    if request.method in ("GET", "HEAD") or request.mimetype not in (
            "application/x-www-form-urlencoded", "multipart/form-data"):
        return False
    form = request.form
    return _any_unsafe(form.keys()) or _any_unsafe(
        (v for vs in form.listvalues() for v in vs), multiline=True)


def refuse_unsafe_input() -> Response | None:
    """Before every Flask route but the intake: 400 for text no page or store can hold."""
    if request.path.startswith(INTAKE_PREFIX) or not _has_unsafe_input():
        return None
    if not wants_json():
        abort(400)
    response = jsonify({"error": "bad_request", "detail": UNSAFE_DETAIL})
    response.status_code = 400
    return response


def init_app(app: Flask) -> None:
    """Bound `<int:…>` path ids and refuse unsafe text before any other request hook."""
    app.url_map.converters["int"] = BoundedIntConverter
    hooks = app.before_request_funcs.setdefault(None, [])
    # After request_log's id (so the 400 is logged with it), before CSRF and sessions.
    hooks.insert(1 if hooks else 0, refuse_unsafe_input)
