"""Strict JSON: one reading for every parser (no duplicate keys), finite numbers, bounded depth.

Python's `json` accepts what other parsers read differently (the last of two
duplicate keys wins where others take the first), turns `1e400` into an
infinity it later writes out as the invalid token `Infinity`, and recurses
until RecursionError on deep nesting. The intake refuses all of these
(CONTRACT section 2) and the pages read stored bodies through the same rules.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any


class StrictJsonError(ValueError):
    """A text that is not strict JSON; the message says why (never quotes the text)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Build an object, refusing a key given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise StrictJsonError("body has a duplicate key")
    return obj


def _finite(literal: str) -> float:
    """Parse a number with a fraction or exponent, refusing one that overflows."""
    value = float(literal)
    if math.isinf(value):
        raise StrictJsonError("body has a number too large to represent")
    return value


def _constant(name: str) -> Any:
    """Refuse NaN and Infinity, which are not JSON."""
    raise StrictJsonError(f"body is not valid JSON ({name} is not a JSON value)")


_CONTAINERS = (dict, list)
# Built once: json.loads(text, **hooks) builds a new decoder on every call.
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_float=_finite,
                            parse_constant=_constant)


def nesting(value: Any, limit: int) -> int:
    """Return how deeply arrays and objects nest in `value` (stops counting past `limit`)."""
    depth, level = 0, [value] if type(value) in _CONTAINERS else []
    while level and depth <= limit:
        depth += 1  # one level at a time: a comprehension per node, no per-child push
        below: list[Any] = []
        for node in level:
            below += [c for c in (node.values() if type(node) is dict else node)
                      if type(c) in _CONTAINERS]
        level = below
    return depth


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _encodable(value: Any) -> bool:
    """Tell whether every string of a decoded value can be written as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def loads(text: str, max_depth: int) -> Any:
    """Decode strict JSON nested at most `max_depth` deep, or raise StrictJsonError."""
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise StrictJsonError(f"body nests deeper than {max_depth} levels") from None
    except StrictJsonError:
        raise
    except ValueError:  # JSONDecodeError, and int() refusing a 4,300-digit number
        raise StrictJsonError("body is not valid JSON") from None
    # Fewer brackets than the limit cannot nest deeper: typical bodies skip the walk.
    if (text.count("{") + text.count("[") > max_depth
            and nesting(value, max_depth) > max_depth):
        raise StrictJsonError(f"body nests deeper than {max_depth} levels")
    # A `\ud800` escape decodes to a lone surrogate, which no UTF-8 page, log or driver can
    # write: strict JSON (RFC 8259 section 8.2, I-JSON) refuses it. Only a text with such
    # an escape pays for the check.
    if _SURROGATE_ESCAPE.search(text) and not _encodable(value):
        raise StrictJsonError("body has a lone surrogate (\\ud800-\\udfff unpaired)")
    return value
