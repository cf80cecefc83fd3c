"""Identifier formats match the whole string: a trailing newline is never part of an id."""

from __future__ import annotations

import pytest

from ledger.errors import InvalidEvent
from ledger.ids import (
    EVENT_ID,
    EVENT_TYPE,
    INTEGRATION_ID,
    KEY_ID,
    SLUG,
    new_integration_id,
    new_key_id,
)
from ledger.intake.pipeline import validate_event_id


def test_ids_slugs_and_event_fields_refuse_a_trailing_newline():
    integration, key = new_integration_id(), new_key_id()
    assert INTEGRATION_ID.match(integration) and KEY_ID.match(key) and SLUG.match("acme")
    assert not INTEGRATION_ID.match(integration + "\n")
    assert not KEY_ID.match(key + "\n")
    assert not SLUG.match("acme\n")
    assert EVENT_ID.fullmatch("evt_1:a.b-c") and not EVENT_ID.fullmatch("evt_1\n")
    assert EVENT_TYPE.fullmatch("demo.credit") and not EVENT_TYPE.fullmatch("demo.credit\n")
    assert not EVENT_ID.fullmatch("x" * 256) and not EVENT_TYPE.fullmatch("x" * 129)


def test_the_intake_refuses_a_trailing_newline_and_names_the_form_it_wants():
    with pytest.raises(InvalidEvent) as refused:
        validate_event_id("evt\n")
    assert refused.value.detail == r"event id must match ^[A-Za-z0-9][A-Za-z0-9._:\-]{0,254}$"
