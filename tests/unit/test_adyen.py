"""Adyen's per-item HMAC, checked against the vector Adyen's own libraries test with."""

from __future__ import annotations

import json

import pytest

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import PROFILES

ADYEN = PROFILES["adyen"]
KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
ITEM = {"pspReference": "7914073381342284", "merchantAccountCode": "TestMerchant",
        "merchantReference": "TestPayment-1407325143704",
        "amount": {"value": 1130, "currency": "EUR"}, "eventCode": "AUTHORISATION",
        "success": "true", "eventDate": "2019-05-06T17:15:34.121+02:00",
        "additionalData": {"hmacSignature": "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0="}}


def body(*items: dict[str, object]) -> bytes:
    """Adyen's envelope around these items."""
    return json.dumps({"live": "false", "notificationItems": [
        {"NotificationRequestItem": item} for item in items]}).encode()


def verify(raw: bytes, secrets: list[str] | None = None) -> int:
    """Verify under the preset."""
    return ADYEN.verify({}, raw, secrets or [KEY], now=0, tolerance=300).secret_index


def refused(raw: bytes) -> str:
    """Return the refusal reason."""
    with pytest.raises(AuthenticationFailed) as caught:
        verify(raw)
    return caught.value.reason


def test_documented_vector_verifies_and_names_its_event() -> None:
    """Adyen's test vector verifies; the id is eventCode:pspReference:success."""
    assert verify(body(ITEM)) == 0
    assert verify(body(ITEM), ["00" * 32, KEY]) == 1
    identity = ADYEN.identity({}, ITEM)
    assert (identity.event_id, identity.event_type) == (
        "AUTHORISATION:7914073381342284:true", "AUTHORISATION")


@pytest.mark.parametrize(("change", "reason"), [
    ({"amount": {"value": 1131, "currency": "EUR"}}, "bad_signature"),
    ({"success": "false"}, "bad_signature"),
    ({"additionalData": {}}, "missing_signature"),
    ({"additionalData": {"hmacSignature": "not base64!"}}, "malformed_signature"),
])
def test_a_changed_or_unsigned_item_is_refused(change: dict[str, object], reason: str) -> None:
    """Any signed field changed, or a signature missing, refuses the whole body."""
    assert refused(body({**ITEM, **change})) == reason
    assert refused(body(ITEM, {**ITEM, **change})) == reason  # one bad item spoils all


def test_fields_outside_the_signed_list_are_not_covered() -> None:
    """Documented limit: eventDate (and additionalData) are not signed."""
    assert verify(body({**ITEM, "eventDate": "2030-01-01T00:00:00+00:00"})) == 0


def test_not_an_adyen_body_is_missing_a_signature() -> None:
    """No notificationItems: nothing is signed."""
    assert refused(b'{"live": "false"}') == "missing_signature"
    assert refused(b"[accepted]") == "missing_signature"
