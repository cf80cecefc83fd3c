"""AWS SNS's scheme: an RSA signature over canonical message fields, by an SNS certificate.

The certificate is never fetched at request time: the operator pins it as the
integration's credential (base64 DER, one line), and the message's SigningCertURL
must still name an SNS host (`sns.<region>.amazonaws.com[.cn]`, HTTPS, a `.pem`).
A SubscriptionConfirmation is recorded as an event (its SubscribeURL in the
payload) for an operator to confirm; nothing is fetched (docs/senders/aws-sns.md).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from ledger.errors import AuthenticationFailed
from ledger.intake.signatures import _common as common
from ledger.intake.signatures.base import HeaderMap, Verified
from ledger.intake.signatures.keys import padded_base64

SNS_HOST = re.compile(r"sns\.[a-z0-9-]{1,30}\.amazonaws\.com(\.cn)?")
NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_KEYS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn",
                     "Type")
HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
EXAMPLE_CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-example.pem"


@lru_cache(maxsize=64)
def sns_public_key(secret: str) -> rsa.RSAPublicKey | None:
    """Return the RSA key of a pinned certificate (base64 DER), None when it is not one."""
    raw = padded_base64(secret) if isinstance(secret, str) else None
    try:
        key = x509.load_der_x509_certificate(raw).public_key() if raw else None
    except ValueError:
        return None
    return key if isinstance(key, rsa.RSAPublicKey) else None


def canonical(message: dict[str, Any]) -> bytes:
    """Return the string SNS signs: `Key\\nValue\\n` for each signed key present, in order."""
    keys = NOTIFICATION_KEYS if message.get("Type") == "Notification" else CONFIRMATION_KEYS
    parts = []
    for key in keys:
        value = message.get(key)
        if isinstance(value, str):
            parts.append(f"{key}\n{value}\n")
    return "".join(parts).encode()


def _message(body: bytes) -> dict[str, Any]:
    """Return the SNS message with its signature fields checked, or raise."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        raise AuthenticationFailed("missing_signature") from None
    if not isinstance(message, dict) or not isinstance(message.get("Signature"), str):
        raise AuthenticationFailed("missing_signature")
    if message.get("SignatureVersion") not in HASHES:
        raise AuthenticationFailed("no_supported_signature")
    url = message.get("SigningCertURL")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme != "https" or not SNS_HOST.fullmatch(
            parts.hostname or "") or not parts.path.endswith(".pem"):
        raise AuthenticationFailed("untrusted_certificate_url")
    return message


@dataclass(frozen=True, slots=True, kw_only=True)
class SnsSignature:
    """RSA PKCS#1 v1.5 (SHA1 for version 1, SHA256 for 2) by a pinned SNS certificate."""

    has_timestamp: bool = True

    def verify(self, headers: HeaderMap, body: bytes, secrets: Sequence[str], *,
               now: int, tolerance: int) -> Verified:
        """Return the pinned certificate that signed the message, or raise."""
        common.require_secrets(secrets)
        message = _message(body)
        try:
            signature = base64.b64decode(message["Signature"], validate=True)
        except (binascii.Error, ValueError):
            raise AuthenticationFailed("malformed_signature") from None
        signed, digest = canonical(message), HASHES[message["SignatureVersion"]]()
        for index, secret in enumerate(secrets):
            key = sns_public_key(secret)
            if key is None:
                continue
            try:
                key.verify(signature, signed, padding.PKCS1v15(), digest)
            except InvalidSignature:
                continue
            stamp = message.get("Timestamp")
            timestamp = common.parse_rfc3339(stamp if isinstance(stamp, str) else "")
            common.check_freshness(timestamp, now=now, tolerance=tolerance)
            return Verified(secret_index=index, timestamp=timestamp)
        raise AuthenticationFailed("bad_signature")

    def sign(self, secret: str, body: bytes, *, event_id: str, timestamp: int) -> dict[str, str]:
        """No header: the signature is in the message (`seal`)."""
        return {"x-amz-sns-message-id": event_id}

    def seal(self, private: str, body: bytes, timestamp: int) -> bytes:
        """Return the message signed by an RSA private key (base64 DER PKCS#8; tests, drills)."""
        raw = padded_base64(private)
        key = serialization.load_der_private_key(raw, None) if raw else None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("not an RSA private key in base64 DER")
        message: dict[str, Any] = json.loads(body)
        message.update(
            Timestamp=datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            SignatureVersion="2", SigningCertURL=EXAMPLE_CERT_URL)
        signature = key.sign(canonical(message), padding.PKCS1v15(), hashes.SHA256())
        message["Signature"] = base64.b64encode(signature).decode()
        return json.dumps(message, separators=(",", ":")).encode()


def sns_pair(name: str = "sns.us-east-1.amazonaws.com") -> tuple[str, str]:
    """Return a fresh (certificate, private key) pair, both base64 DER (tests, drills)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    moment = datetime.now(UTC)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(moment - timedelta(days=1))
                   .not_valid_after(moment + timedelta(days=365))
                   .sign(private, hashes.SHA256()))
    der_private = private.private_bytes(serialization.Encoding.DER,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    return (base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode(),
            base64.b64encode(der_private).decode())
