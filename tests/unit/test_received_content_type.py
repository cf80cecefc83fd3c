"""The Content-Type a job keeps for its destination: as received, or nothing if unusable."""

from __future__ import annotations

import pytest

from ledger.intake.signatures._common import received_content_type


@pytest.mark.parametrize("value", ["application/json", "application/json; charset=utf-8",
                                   "application/x-www-form-urlencoded; charset=UTF-8",
                                   "x" * 255])
def test_a_usable_content_type_is_kept_as_received(value: str) -> None:
    assert received_content_type({"content-type": [value]}) == value


@pytest.mark.parametrize("values", [[], [""], ["  "], ["a", "b"], ["x" * 256],
                                    ["text/plain\x01"], ["text/plain; n=\u00e9"],
                                    ["text/plain\r\nX-Evil: 1"]])
def test_an_unusable_content_type_is_not_kept(values: list[str]) -> None:
    assert received_content_type({"content-type": values}) is None
