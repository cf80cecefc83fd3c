"""AWS SNS messages signed as AWS documents (RSA over `Key\\nValue\\n` canonical fields),
verified against an operator-pinned certificate; the certificate is never fetched."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import PROFILES
from tests.profile_keys import KEYS, OTHER_KEYS

SNS = PROFILES["aws-sns"]
NOW = int(time.time())
STAMP = time.strftime("%Y-%m-%dT%H:%M:%S.123Z", time.gmtime(NOW))
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem"


def signed(message: dict[str, Any], version: str = "1", *, private: str | None = None) -> bytes:
    """Sign `message` as SNS does: the documented canonical string, SHA1 (v1) or SHA256 (v2)."""
    keys = (["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
            if message["Type"] == "Notification" else
            ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"])
    text = "".join(f"{key}\n{message[key]}\n" for key in keys if key in message)
    key = serialization.load_der_private_key(
        base64.b64decode(private or KEYS["aws-sns"].signing), None)
    digest = hashes.SHA1() if version == "1" else hashes.SHA256()
    signature = key.sign(text.encode(), padding.PKCS1v15(), digest)  # type: ignore[union-attr, call-arg]
    return json.dumps({**message, "SignatureVersion": version, "SigningCertURL": CERT_URL,
                       "Signature": base64.b64encode(signature).decode()}).encode()


NOTIFICATION = {"Type": "Notification", "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
                "TopicArn": "arn:aws:sns:eu-west-1:123456789012:orders", "Subject": "hi",
                "Message": '{"order": 1}', "Timestamp": STAMP}
CONFIRMATION = {"Type": "SubscriptionConfirmation",
                "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b", "Token": "2336412f37",
                "TopicArn": "arn:aws:sns:eu-west-1:123456789012:orders",
                "Message": "You have chosen to subscribe…",
                "SubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription",
                "Timestamp": STAMP}


def verify(body: bytes, secrets: list[str] | None = None) -> int:
    """Verify under the preset with the pinned certificate."""
    return SNS.verify({}, body, secrets or [KEYS["aws-sns"].stored], now=NOW,
                      tolerance=300).secret_index


def refused(body: bytes) -> str:
    """Return the refusal reason."""
    with pytest.raises(AuthenticationFailed) as caught:
        verify(body)
    return caught.value.reason


@pytest.mark.parametrize("version", ["1", "2"])
@pytest.mark.parametrize("message", [NOTIFICATION, CONFIRMATION, {
    k: v for k, v in NOTIFICATION.items() if k != "Subject"}])
def test_signed_messages_verify(message: dict[str, Any], version: str) -> None:
    """Notifications (with or without Subject) and confirmations, both signature versions."""
    assert verify(signed(message, version)) == 0
    pinned = [OTHER_KEYS["aws-sns"].stored, KEYS["aws-sns"].stored]
    assert verify(signed(message, version), pinned) == 1


def test_identity_is_the_message_id_and_type() -> None:
    """The id is the signed MessageId; the type the signed Type."""
    identity = SNS.identity({}, CONFIRMATION)
    assert (identity.event_id, identity.event_type) == (CONFIRMATION["MessageId"],
                                                       "SubscriptionConfirmation")


@pytest.mark.parametrize(("body", "reason"), [
    (signed({**NOTIFICATION}).replace(b'{\\"order\\": 1}', b'{\\"order\\": 2}'),
     "bad_signature"),
    (signed(NOTIFICATION, private=OTHER_KEYS["aws-sns"].signing), "bad_signature"),
    (signed(NOTIFICATION).replace(b"sns.eu-west-1.amazonaws.com", b"sns.evil.example.com"),
     "untrusted_certificate_url"),
    (signed(NOTIFICATION).replace(b"https://sns", b"http://sns"), "untrusted_certificate_url"),
    (signed(NOTIFICATION).replace(b'"SignatureVersion": "1"', b'"SignatureVersion": "3"'),
     "no_supported_signature"),
    (json.dumps(NOTIFICATION).encode(), "missing_signature"),
    (signed({**NOTIFICATION, "Timestamp": time.strftime(
        "%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(NOW - 3600))}), "stale_timestamp"),
])
def test_forged_foreign_or_stale_messages_are_refused(body: bytes, reason: str) -> None:
    """A changed message, another certificate, a non-SNS certificate URL, a stale time."""
    assert refused(body) == reason


def test_a_credential_that_is_not_a_certificate_is_refused() -> None:
    """The credential must be the SNS signing certificate, base64 DER."""
    assert SNS.secret.check("not a certificate") is not None
    assert SNS.secret.check(KEYS["aws-sns"].stored) is None
    assert SNS.secret.generate is None
