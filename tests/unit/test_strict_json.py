"""Strict JSON: one reading for every parser, finite numbers, bounded depth."""

from __future__ import annotations

import pytest

from ledger.strict_json import StrictJsonError, loads, nesting


@pytest.mark.parametrize(("text", "depth"), [
    ("1", 0), ("{}", 1), ("[[[]]]", 3), ('{"a": [1, {"b": []}], "c": {}}', 4),
    ("[" * 70 + "]" * 70, 65),  # stops counting past the limit
])
def test_nesting_counts_levels_of_arrays_and_objects(text, depth):
    assert nesting(loads(text, 1000), 64) == depth


@pytest.mark.parametrize(("text", "reason"), [
    ('{"a": 1, "a": 2}', "duplicate key"),
    ('{"a": {"b": 1, "b": 1}}', "duplicate key"),
    ('{"a": 1e400}', "too large"),
    ("[-1e400]", "too large"),
    ('{"a": NaN}', "not valid JSON"),
    ("[Infinity]", "not valid JSON"),
    ("[" * 65 + "]" * 65, "deeper than 64"),
    ("[" * 5000 + "]" * 5000, "deeper than 64"),  # would be RecursionError
    ('{"a": 1} x', "not valid JSON"),
    ("1" * 5000, "not valid JSON"),  # over Python's int-digits limit
])
def test_what_parsers_read_differently_is_refused(text, reason):
    with pytest.raises(StrictJsonError, match=reason):
        loads(text, 64)


def test_the_deepest_allowed_body_and_big_but_finite_numbers_pass():
    assert nesting(loads("[" * 64 + "]" * 64, 64), 64) == 64
    assert loads('{"a": 1.7976931348623157e308, "b": 123456789012345678901234567890}',
                 64) == {"a": 1.7976931348623157e308, "b": 123456789012345678901234567890}
