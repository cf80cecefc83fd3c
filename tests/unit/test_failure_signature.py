"""Error signatures: failures of one cause share one, whatever ids and numbers they carry."""

from __future__ import annotations

from ledger.reads.groups import error_signature, group_id


def test_numbers_and_ids_are_normalised_but_the_class_and_words_are_kept() -> None:
    a = error_signature("ValueError: amount 7 too big for acct_42 (evt_9f3a)")
    b = error_signature("ValueError:  amount 1200 too big for acct_7 (evt_0001)")
    assert a == b == "ValueError: amount <n> too big for <id> (<id>)"
    assert error_signature("KeyError: 'customer'") != error_signature("KeyError: 'amount'")
    assert error_signature("TypeError: amount 7") != error_signature("ValueError: amount 7")


def test_uuids_and_digests_become_placeholders() -> None:
    sig = error_signature("LookupError: no row 0b7e6c7a-1d2f-4e55-9a0b-3c2d1e0f9a8b "
                          "digest 9f86d081884c7d659a2feaa0c55ad015")
    assert sig == "LookupError: no row <uuid> digest <hex>"


def test_a_missing_error_and_a_bare_message_have_signatures() -> None:
    assert error_signature(None) == "(no error recorded)"
    assert error_signature("the handler returned nothing") == \
        "Error: the handler returned nothing"
    assert error_signature("MaxAttemptsExceeded") == "MaxAttemptsExceeded"


def test_a_group_is_one_event_type_and_one_signature() -> None:
    sig = error_signature("ValueError: amount 7")
    assert group_id("demo.credit", sig) == group_id("demo.credit", sig)
    assert group_id("demo.credit", sig) != group_id("demo.fail", sig)
    assert len(group_id("demo.credit", sig)) == 16
