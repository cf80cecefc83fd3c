"""Mailgun's body-carried signature, computed here as Mailgun's docs describe it: hex
HMAC-SHA256 of `{timestamp}{token}` under the webhook signing key."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import PROFILES
from tests.profile_keys import KEYS, OTHER_KEYS

NOW = 1_700_000_000
KEY = KEYS["mailgun"].stored
MAILGUN = PROFILES["mailgun"]


def body_with(signature: object, **event: object) -> bytes:
    """A Mailgun webhook body carrying `signature`."""
    return json.dumps({"signature": signature,
                       "event-data": {"id": "CPgfbmQMTCKtHW6uIWtuVe", "event": "delivered",
                                      **event}}).encode()


def signature(timestamp: str = str(NOW), token: str = "a8ce0edb2dd8301dee6c2405235584e45a",
              key: str = KEY) -> dict[str, str]:
    """The signature object Mailgun writes."""
    mac = hmac.new(key.encode(), (timestamp + token).encode(), hashlib.sha256).hexdigest()
    return {"timestamp": timestamp, "token": token, "signature": mac}


def verify(body: bytes, secrets: list[str] | None = None, now: int = NOW) -> int:
    """Verify under the preset."""
    return MAILGUN.verify({}, body, secrets or [KEY], now=now, tolerance=300).secret_index


def refused(body: bytes, **kwargs: object) -> str:
    """Return the refusal reason."""
    with pytest.raises(AuthenticationFailed) as caught:
        verify(body, **kwargs)  # type: ignore[arg-type]
    return caught.value.reason


def test_documented_recipe_verifies_and_rotation_names_the_key() -> None:
    """The docs' recipe verifies; with two live keys the second is named."""
    assert verify(body_with(signature())) == 0
    assert verify(body_with(signature()), [OTHER_KEYS["mailgun"].stored, KEY]) == 1


@pytest.mark.parametrize(("sig", "reason"), [
    (None, "missing_signature"),
    ({"timestamp": str(NOW), "token": "abc"}, "missing_signature"),
    ({**signature(), "signature": "ZZ" * 32}, "malformed_signature"),
    ({**signature(), "token": "not a token!"}, "malformed_signature"),
    ({**signature(), "timestamp": "0123"}, "malformed_timestamp"),
    (signature(key="another key"), "bad_signature"),
    ({**signature(), "token": "b8ce0edb2dd8301dee6c2405235584e45a"}, "bad_signature"),
    (signature(timestamp=str(NOW - 3600)), "stale_timestamp"),
])
def test_bad_signature_objects_are_refused(sig: object, reason: str) -> None:
    """Each malformed, missing, foreign or stale signature object gets its own reason."""
    assert refused(body_with(sig)) == reason


def test_not_json_is_missing_a_signature() -> None:
    """A body that is not JSON carries no signature object."""
    assert refused(b"timestamp=1&token=2&signature=3") == "missing_signature"


def test_the_event_is_not_covered_and_the_id_is_unsigned() -> None:
    """Documented limit: event-data can change under a valid signature object."""
    assert verify(body_with(signature(), event="failed")) == 0
    assert MAILGUN.id_is_signed is False


def test_seal_writes_what_verify_accepts() -> None:
    """The sender's half (drills, tests) writes a signature object that verifies."""
    sealed = MAILGUN.seal(KEY, MAILGUN.compose("e-1", "delivered", {}), NOW)
    assert verify(sealed) == 0
    assert MAILGUN.identity({}, json.loads(sealed)).event_type == "delivered"
